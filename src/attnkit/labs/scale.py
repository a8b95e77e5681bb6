"""Lab ``scale``: d_k = 64 with and without 1/sqrt(d_k).

Two parts. At initialisation, for q and k with unit-variance entries (the tutorial's assumption) and d_k from
16 to 1024: row entropy, max probability, the share of near one-hot rows and the gradient norm that flows
back through the softmax. In training: two otherwise identical models with d_k = 64 on byte-level text, one
with the scale and one without (``scale=1``): loss curves and the same attention statistics on a fixed batch.
"""

from __future__ import annotations

import math

import torch

from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.metrics import head_metrics
from attnkit.labs.harness import learned, seeded, text_data, tiny_lm, train
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim, fmt
from attnkit.nn import MultiHeadAttention

ONE_HOT = 0.9  # a row is "near one-hot" when its largest probability is at least this


def softmax_stats(scores: torch.Tensor) -> dict:
    """Row statistics of ``softmax(scores)`` ``(N, L)`` and the gradient norm through it.

    ``grad`` is the mean over rows of ``|d(p . u)/d scores|`` for a fixed random direction ``u`` (what a loss
    that depends on the attention output sends back to the scores)."""
    scores = scores.detach().double().requires_grad_(True)
    p = scores.softmax(-1)  # (N, L)
    u = torch.randn(p.shape, generator=torch.Generator().manual_seed(1), dtype=p.dtype)
    (grad,) = torch.autograd.grad((p * u).sum(), scores)
    m = head_metrics(p.detach()[None, None])  # one "head" holding every row
    max_prob = p.detach().amax(-1)
    return {"norm_entropy": m.norm_entropy[0], "max_prob": m.max_prob[0],
            "one_hot_share": float((max_prob >= ONE_HOT).double().mean()), "grad": float(grad.norm(dim=-1).mean())}


def init_sweep(dims: list[int], length: int, rows: int) -> dict:
    g = torch.Generator().manual_seed(0)
    out = {"scaled": {}, "unscaled": {}}
    for D in dims:
        q = torch.randn(rows, D, generator=g, dtype=torch.float64)  # (N, D) unit-variance entries
        k = torch.randn(length, D, generator=g, dtype=torch.float64)  # (L, D)
        raw = q @ k.T  # (N, L): variance D
        out["unscaled"][D] = softmax_stats(raw)
        out["scaled"][D] = softmax_stats(raw / math.sqrt(D))
    return out


def attention_stats(model, inputs) -> dict:
    """Mean statistics of every layer's attention rows on a fixed batch (causal rows with >= 2 keys)."""
    with torch.no_grad(), capture(model, scores=True) as cap:
        model(inputs)
    maxp, ent, share, logit = [], [], [], []
    for r in cap.records:
        m = head_metrics(r.weights, r.allowed)
        maxp += m.max_prob
        ent += m.norm_entropy
        w = r.weights[:, :, 1:]  # (B, H, L-1, L): the first row sees one key
        share.append(float((w.amax(-1) >= ONE_HOT).double().mean()))
        s = r.scores[torch.isfinite(r.scores)]
        logit.append(float(s.abs().max()))
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"max_prob": mean(maxp), "norm_entropy": mean(ent), "one_hot_share": mean(share), "max_logit": max(logit)}


def qkv_grad_norm(model, inputs, targets) -> float:
    """Gradient norm of all query/key/value projection weights on a fixed batch."""
    from attnkit.labs.harness import loss_of

    model.zero_grad(set_to_none=True)
    loss_of(model, inputs, targets).backward()
    norms = [m.qkv_proj.weight.grad.norm() for m in model.modules() if isinstance(m, MultiHeadAttention)]
    model.zero_grad(set_to_none=True)
    return float(torch.stack(norms).norm())


def train_pair(p: dict) -> dict:
    data = text_data(p["train_bytes"], 100_000)
    probe_x, probe_y = data.eval_windows(p["seq_len"], 8 * p["seq_len"])
    runs = {}
    for name in ("scaled", "unscaled"):
        seeded(p["seed"])
        model = tiny_lm(embed_dim=p["dim"], num_heads=p["dim"] // 64, num_layers=2, max_seq_len=p["seq_len"])
        if name == "unscaled":
            for block in model.blocks:
                block.attn.scale = 1.0  # MultiHeadAttention's score scale: no 1/sqrt(d_k)

        def probe(step, m, hist):
            hist.log("step", step)
            for key, value in attention_stats(m, probe_x).items():
                hist.log(key, value)
            hist.log("qkv_grad", qkv_grad_norm(m, probe_x, probe_y))

        hist = train(model, data.sampler(p["batch"], p["seq_len"]), steps=p["steps"], lr=p["lr"], seed=p["seed"],
                     on_step=probe, every=p["every"])
        runs[name] = {**hist.to_dict(), "final_loss": hist.final_loss()}
    return runs


SIZES = {
    "default": {"dims": [16, 32, 64, 128, 256, 512, 1024], "length": 64, "rows": 512, "dim": 128, "seq_len": 64,
                "batch": 16, "steps": 400, "every": 25, "lr": 3e-3, "train_bytes": 1_000_000},
    "quick": {"dims": [16, 64, 1024], "length": 32, "rows": 64, "dim": 128, "seq_len": 16, "batch": 4,
              "steps": 6, "every": 3, "lr": 3e-3, "train_bytes": 100_000},
}


def _init(m, which, D=64):
    return m["init"][which][str(D)] if str(D) in m["init"][which] else m["init"][which][D]


def _trained(m) -> float:
    """The precondition of the claims about training: the scaled model learned (else they are "not measured")."""
    return learned(m["train"]["scaled"]["final_loss"], "the scaled model")


CLAIMS = [
    Claim("Without 1/sqrt(d_k), unit-variance q.k has variance d_k and rows turn near one-hot (d_k = 64, at init)",
          "unscaled: mean max-prob >= 0.5 and >= 20% of rows near one-hot (max-prob >= 0.9); scaled: mean "
          "max-prob <= 0.2",
          lambda m: (f"unscaled max-prob {fmt(_init(m, 'unscaled')['max_prob'])}, one-hot share "
                     f"{fmt(_init(m, 'unscaled')['one_hot_share'])}; scaled max-prob "
                     f"{fmt(_init(m, 'scaled')['max_prob'])}",
                     [_init(m, "unscaled")["max_prob"] >= 0.5 and _init(m, "unscaled")["one_hot_share"] >= 0.2,
                      _init(m, "scaled")["max_prob"] <= 0.2])),
    Claim("The scale makes the softmax's sharpness independent of d_k (sweep 16..max at init)",
          "scaled: normalised entropy spread across d_k <= 0.05; unscaled: entropy at the largest d_k <= 0.3",
          lambda m: (f"scaled entropy {fmt(min(v['norm_entropy'] for v in m['init']['scaled'].values()))}.."
                     f"{fmt(max(v['norm_entropy'] for v in m['init']['scaled'].values()))}; unscaled at largest "
                     f"d_k {fmt(list(m['init']['unscaled'].values())[-1]['norm_entropy'])}",
                     [max(v["norm_entropy"] for v in m["init"]["scaled"].values())
                      - min(v["norm_entropy"] for v in m["init"]["scaled"].values()) <= 0.05,
                      list(m["init"]["unscaled"].values())[-1]["norm_entropy"] <= 0.3])),
    Claim("A saturated softmax passes back little gradient (d_k = 64, at init)",
          "gradient norm through the softmax, unscaled <= 0.5 x scaled",
          lambda m: (f"unscaled {fmt(_init(m, 'unscaled')['grad'])} vs scaled {fmt(_init(m, 'scaled')['grad'])}",
                     [_init(m, "unscaled")["grad"] <= 0.5 * _init(m, "scaled")["grad"]])),
    Claim("In a real model at init (GPT init std 0.02, LayerNorm inputs) the missing scale already makes rows "
          "near one-hot",
          "unscaled model at step 0: mean max-prob >= 0.5",
          lambda m: (f"unscaled model step 0: max-prob {fmt(m['train']['unscaled']['max_prob'][0])}, max |logit| "
                     f"{fmt(m['train']['unscaled']['max_logit'][0])}",
                     [m["train"]["unscaled"]["max_prob"][0] >= 0.5])),
    Claim("Without the scale the model trains worse (\"barely updates\")",
          "final training loss (mean of the last 20 steps) unscaled >= 1.05 x scaled",
          lambda m: (f"unscaled {fmt(m['train']['unscaled']['final_loss'])} vs scaled "
                     f"{fmt(m['train']['scaled']['final_loss'])}",
                     [m["train"]["unscaled"]["final_loss"] >= 1.05 * m["train"]["scaled"]["final_loss"]]),
          needs=_trained),
    Claim("During training the unscaled model's attention turns more one-hot than the scaled one's",
          "near one-hot share at the end: unscaled >= 2 x scaled (and above it) and >= 10%",
          lambda m: (f"unscaled {fmt(m['train']['unscaled']['one_hot_share'][-1])} vs scaled "
                     f"{fmt(m['train']['scaled']['one_hot_share'][-1])}",
                     [m["train"]["unscaled"]["one_hot_share"][-1] >= 2 * m["train"]["scaled"]["one_hot_share"][-1]
                      and m["train"]["unscaled"]["one_hot_share"][-1] > m["train"]["scaled"]["one_hot_share"][-1],
                      m["train"]["unscaled"]["one_hot_share"][-1] >= 0.1]),
          needs=_trained),  # attention "during training" of a model that learned nothing is no evidence
]


@lab("scale", "the 1/sqrt(d_k) scale", sizes=SIZES, claims=CLAIMS)
def measure(p: dict, plots) -> dict:
    init = init_sweep(p["dims"], p["length"], p["rows"])
    runs = train_pair(p)
    dims = p["dims"]
    with plots.figure("init_sweep", f"softmax rows at init, L={p['length']}, unit-variance q, k", ncols=2) as (a, b):
        for which, style in (("scaled", "-o"), ("unscaled", "--s")):
            a.plot(dims, [init[which][D]["norm_entropy"] for D in dims], style, label=which)
            b.plot(dims, [init[which][D]["grad"] for D in dims], style, label=which)
        for ax, label in ((a, "entropy / log L"), (b, "grad norm through softmax")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("d_k")
            ax.set_ylabel(label)
            ax.legend(fontsize=8)
        b.set_yscale("log")
    with plots.figure("training", f"d_k=64, width {p['dim']}, text L={p['seq_len']}", ncols=2) as (a, b):
        for name, run in runs.items():
            a.plot(run["loss"], label=name, lw=0.8)
            b.plot(run["step"], run["max_prob"], "-o", ms=3, label=name)
        a.set_xlabel("step")
        a.set_ylabel("training loss (nats)")
        b.set_xlabel("step")
        b.set_ylabel("mean max attention prob")
        a.legend(fontsize=8)
        b.legend(fontsize=8)
    notes = [f"Init sweep: {p['rows']} query rows against L={p['length']} keys, q and k entries drawn from N(0, 1).",
             f"Training: two 2-layer models of width {p['dim']} (head dim 64), {p['steps']} AdamW steps, batch "
             f"{p['batch']} x {p['seq_len']} bytes of stdlib source, same seed and data order; statistics on a fixed "
             "validation batch every " + str(p["every"]) + " steps."]
    return {"init": init, "train": runs, "notes": notes}
