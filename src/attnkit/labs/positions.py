"""Lab ``positions``: train at length L with each position scheme, evaluate at L, 2L, 4L, 8L.

Schemes: sinusoidal and learned embeddings (added to the tokens), RoPE and ALiBi (inside attention) and
none (causal attention alone). Every model has the same width, depth, data, seed and steps.

Evaluation protocol: non-overlapping windows of the evaluation length over the same validation tokens;
each window starts with an empty context and every token in it is scored (Press et al.'s "non-overlapping"
protocol, the harsher one: a sliding window that scores only the last tokens gives every token a long
context and hides much of the difference). Learned positions have a table of L rows: past it the model
refuses (a typed error), which is what we record.
"""

from __future__ import annotations

from attnkit.labs.harness import learned, loss_at_lengths, seeded, text_data, tiny_lm, train
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim, fmt

SCHEMES = ("sinusoidal", "learned", "rope", "alibi", "none")
COLORS = {"sinusoidal": "C0", "learned": "C3", "rope": "C1", "alibi": "C2", "none": "C4"}
PRESS = {"sinusoidal": (20.05, 406.0), "rope": (20.07, 79.0), "alibi": (19.73, 18.3)}  # ppl at L=512 -> long


def ratio(m: dict, scheme: str, factor: int) -> float:
    """Loss at ``factor`` x L over loss at L (a string result - the model refused - raises TypeError)."""
    losses = m["losses"][scheme]
    L = m["train_len"]
    return losses[str(factor * L)] / losses[str(L)]


def trained(*schemes: str):
    """``needs=``: each of ``schemes`` learned something at the training length."""
    return lambda m: [learned(m["losses"][s][str(m["train_len"])], f"the {s} model") for s in schemes]


def press_ratio(scheme: str) -> float:
    import math

    short, long = PRESS[scheme]
    return math.log(long) / math.log(short)


SIZES = {
    "default": {"seq_len": 64, "factors": [1, 2, 4, 8], "dim": 64, "layers": 2, "heads": 2, "batch": 16,
                "steps": 600, "lr": 3e-3, "train_bytes": 2_000_000, "eval_tokens": 16384},
    "quick": {"seq_len": 16, "factors": [1, 2, 4, 8], "dim": 32, "layers": 1, "heads": 2, "batch": 4, "steps": 8,
              "lr": 3e-3, "train_bytes": 100_000, "eval_tokens": 512},
}

CLAIMS = [
    Claim("At the training length every scheme reaches about the same loss",
          "each scheme's loss at L within 5% of the best scheme's loss at L",
          lambda m: (", ".join(f"{s} {fmt(m['losses'][s][str(m['train_len'])])}" for s in SCHEMES),
                     [m["losses"][s][str(m["train_len"])] <= 1.05 * min(m["losses"][t][str(m["train_len"])]
                                                                         for t in SCHEMES) for s in SCHEMES]),
          needs=lambda m: learned(min(m["losses"][s][str(m["train_len"])] for s in SCHEMES), "the best scheme")),
    Claim("ALiBi extrapolates (Press et al.: 19.73 -> 18.3 ppl)",
          "ALiBi loss at 4L within 5% of its loss at L, and at 8L within 10%",
          lambda m: (f"ALiBi loss ratio 4L/L {fmt(ratio(m, 'alibi', 4))}, 8L/L {fmt(ratio(m, 'alibi', 8))}",
                     [ratio(m, "alibi", 4) <= 1.05, ratio(m, "alibi", 8) <= 1.10]),
          needs=trained("alibi")),
    Claim("Sinusoidal positions do not extrapolate (Press et al.: 20.05 -> 406 ppl, loss x2.0)",
          "sinusoidal loss at 4L >= 1.5 x its loss at L",
          lambda m: (f"sinusoidal loss ratio 4L/L {fmt(ratio(m, 'sinusoidal', 4))} (Press: "
                     f"{fmt(press_ratio('sinusoidal'))})", [ratio(m, "sinusoidal", 4) >= 1.5]),
          needs=trained("sinusoidal")),
    Claim("Rotary sits in between (Press et al.: 20.07 -> 79 ppl, loss x1.46)",
          "RoPE's 4L/L loss ratio above ALiBi's and below sinusoidal's",
          lambda m: (f"4L/L: ALiBi {fmt(ratio(m, 'alibi', 4))}, RoPE {fmt(ratio(m, 'rope', 4))}, sinusoidal "
                     f"{fmt(ratio(m, 'sinusoidal', 4))}",
                     [ratio(m, "alibi", 4) < ratio(m, "rope", 4), ratio(m, "rope", 4) < ratio(m, "sinusoidal", 4)]),
          needs=trained("alibi", "rope", "sinusoidal")),
    Claim("Learned absolute positions cannot go past their table at all",
          "evaluation at 2L refuses with an error (no silent wrap-around or clamping)",
          lambda m: (str(m["losses"]["learned"][str(2 * m["train_len"])])[:140],
                     [isinstance(m["losses"]["learned"][str(2 * m["train_len"])], str)])),
]


@lab("positions", "position schemes past the training length", sizes=SIZES, claims=CLAIMS)
def measure(p: dict, plots) -> dict:
    data = text_data(p["train_bytes"], max(100_000, p["eval_tokens"] + 1))
    L = p["seq_len"]
    lengths = [f * L for f in p["factors"]]
    losses, curves = {}, {}
    for scheme in SCHEMES:
        seeded(p["seed"])
        model = tiny_lm(embed_dim=p["dim"], num_layers=p["layers"], num_heads=p["heads"], max_seq_len=L, positions=scheme)
        hist = train(model, data.sampler(p["batch"], L), steps=p["steps"], lr=p["lr"], seed=p["seed"])
        losses[scheme] = {str(k): v for k, v in loss_at_lengths(model, data, lengths, p["eval_tokens"]).items()}
        curves[scheme] = hist.loss
    with plots.figure("extrapolation", f"trained at L={L}; non-overlapping windows, {p['eval_tokens']} val tokens",
                      ncols=2) as (a, b):
        for scheme in SCHEMES:
            pts = [(n, v) for n, v in ((int(k), v) for k, v in losses[scheme].items()) if not isinstance(v, str)]
            a.plot([n for n, _ in pts], [v for _, v in pts], "-o", ms=3, color=COLORS[scheme], label=scheme)
        a.set_xscale("log", base=2)
        a.set_xlabel("evaluation length")
        a.set_ylabel("validation loss (nats)")
        a.legend(fontsize=7)
        for scheme in PRESS:  # the same colour for a scheme's published and measured ratio
            v = losses[scheme]
            b.plot([1, 4], [1.0, press_ratio(scheme)], "--", color=COLORS[scheme], label=f"Press {scheme}")
            b.plot([1, 4], [1.0, v[str(4 * L)] / v[str(L)]], "-o", ms=3, color=COLORS[scheme], label=f"ours {scheme}")
        b.set_xlabel("evaluation length / L")
        b.set_ylabel("loss / loss at L")
        b.legend(fontsize=6)
    notes = [f"{len(SCHEMES)} models of width {p['dim']}, {p['layers']} layers, {p['heads']} heads, trained "
             f"{p['steps']} steps on {p['batch']} x {L} bytes of stdlib source (same seed and batches).",
             f"Protocol: non-overlapping windows over the same {p['eval_tokens']} validation tokens at every length; "
             "each window starts with an empty context and all its tokens are scored.",
             "Press et al. (WikiText-103, L=512, 247M parameters) report perplexity; we compare loss ratios "
             "(log perplexity): ln(406)/ln(20.05) = 2.0 for sinusoidal, 1.46 for rotary, 0.97 for ALiBi."]
    return {"train_len": L, "losses": losses, "train_loss": curves, "press_ppl": PRESS, "notes": notes}
