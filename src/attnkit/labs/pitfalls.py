"""Lab ``pitfalls``: the rest of the tutorial's checklist, each as a small controlled run.

1. Initialisation too large: normal(0, 1) instead of normal(0, 0.02) (``LMConfig.init_std``): the first loss
   against ln(vocab) and the loss after training.
2. Attention dropout 0 vs 0.1 on a small dataset (a few KB, many epochs): the train / validation gap.
   Only the attention probabilities are dropped (``MultiHeadAttention.dropout``); everything else is equal.
3. Sinusoidal positions added before vs after a normalisation of the embeddings: ``LN(tok + pos)`` vs
   ``LN(tok) + pos``, trained at a high learning rate: final loss and the largest gradient norm.
4. Short train, long test with the library default (RoPE): train at L, evaluate at L, 2L, 4L.
"""

from __future__ import annotations

import math

from torch import nn

from attnkit.labs.harness import (
    VOCAB,
    TextData,
    evaluate,
    learned,
    loss_at_lengths,
    seeded,
    text_data,
    tiny_lm,
    train,
)
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim, fmt


def init_runs(p, data) -> dict:
    out = {}
    x, y = data.eval_windows(p["seq_len"], p["eval_windows"] * p["seq_len"])
    for std in (0.02, 1.0):
        seeded(p["seed"])
        model = tiny_lm(max_seq_len=p["seq_len"], init_std=std)
        first = evaluate(model, x, y)
        hist = train(model, data.sampler(p["batch"], p["seq_len"]), steps=p["steps"], lr=p["lr"], seed=p["seed"])
        out[str(std)] = {"first_loss": first, "final_loss": hist.final_loss(), "val_loss": evaluate(model, x, y),
                         "loss": hist.loss, "max_grad_norm": max(hist.grad_norm)}
    return out


def dropout_runs(p, data) -> dict:
    """Attention dropout on a tiny training set: train-window loss, validation loss, gap."""
    small = TextData(data.train_stream[: p["small_bytes"]], data.val_stream)
    train_x, train_y = TextData(small.train_stream, small.train_stream).eval_windows(
        p["seq_len"], p["eval_windows"] * p["seq_len"])
    val_x, val_y = data.eval_windows(p["seq_len"], p["eval_windows"] * p["seq_len"])
    out = {}
    for rate in (0.0, 0.1):
        seeded(p["seed"])
        model = tiny_lm(max_seq_len=p["seq_len"])
        for block in model.blocks:
            block.attn.dropout = rate  # attention probabilities only
        train(model, small.sampler(p["batch"], p["seq_len"]), steps=p["dropout_steps"], lr=p["lr"], seed=p["seed"])
        tr, va = evaluate(model, train_x, train_y), evaluate(model, val_x, val_y)
        out[str(rate)] = {"train_loss": tr, "val_loss": va, "gap": va - tr}
    return out


def add_norm(model: nn.Module, where: str) -> nn.Module:
    """``LN(tok + pos)`` ("before": the positions go through the norm) or ``LN(tok) + pos`` ("after")."""
    norm = nn.LayerNorm(model.config.embed_dim)
    model.pos_norm = norm  # registered, so it trains
    target = model.dropout if where == "before" else model.embed  # dropout sees tok + pos; embed sees tok
    target.register_forward_hook(lambda module, args, output: norm(output))
    return model


def norm_runs(p, data) -> dict:
    x, y = data.eval_windows(p["seq_len"], p["eval_windows"] * p["seq_len"])
    out = {}
    for where in ("before", "after"):
        seeded(p["seed"])
        model = add_norm(tiny_lm(max_seq_len=p["seq_len"], positions="sinusoidal"), where)
        hist = train(model, data.sampler(p["batch"], p["seq_len"]), steps=p["steps"], lr=p["high_lr"],
                     seed=p["seed"], clip=None)
        finite = [v for v in hist.loss if math.isfinite(v)]
        out[where] = {"val_loss": evaluate(model, x, y), "max_grad_norm": max(hist.grad_norm),
                      "spikes": sum(b > 1.2 * a for a, b in zip(finite, finite[1:])), "loss": hist.loss}
    return out


def short_long(p, data) -> dict:
    seeded(p["seed"])
    model = tiny_lm(max_seq_len=p["seq_len"])
    train(model, data.sampler(p["batch"], p["seq_len"]), steps=p["steps"], lr=p["lr"], seed=p["seed"])
    lengths = [f * p["seq_len"] for f in (1, 2, 4)]
    return {str(k): v for k, v in loss_at_lengths(model, data, lengths, p["eval_tokens"]).items()}


SIZES = {
    "default": {"seq_len": 64, "batch": 16, "steps": 300, "lr": 3e-3, "high_lr": 1e-2, "train_bytes": 1_000_000,
                "small_bytes": 16_000, "dropout_steps": 500, "eval_windows": 32, "eval_tokens": 8192},
    "quick": {"seq_len": 16, "batch": 4, "steps": 4, "lr": 3e-3, "high_lr": 1e-2, "train_bytes": 100_000,
              "small_bytes": 2_000, "dropout_steps": 4, "eval_windows": 2, "eval_tokens": 256},
}

LN_V = math.log(VOCAB)
I = lambda m, s: m["init"][s]  # noqa: E731
D = lambda m, r: m["dropout"][r]  # noqa: E731
N = lambda m, w: m["norm"][w]  # noqa: E731
S = lambda m: m["short_long"]  # noqa: E731

CLAIMS = [
    Claim("normal(0, 1) initialisation starts far from ln(vocab); 0.02 starts near it",
          f"first loss: std 1.0 >= 2 x ln(V) = {2 * LN_V:.2f}; std 0.02 within 0.5 of ln(V) = {LN_V:.2f}",
          lambda m: (f"first loss std 1.0: {fmt(I(m, '1.0')['first_loss'])}, std 0.02: "
                     f"{fmt(I(m, '0.02')['first_loss'])}",
                     [I(m, "1.0")["first_loss"] >= 2 * LN_V, abs(I(m, "0.02")["first_loss"] - LN_V) <= 0.5])),
    Claim("... and the large initialisation still trains worse after the same steps",
          "validation loss after training: std 1.0 >= 1.2 x std 0.02",
          lambda m: (f"std 1.0: {fmt(I(m, '1.0')['val_loss'])}, std 0.02: {fmt(I(m, '0.02')['val_loss'])}",
                     [I(m, "1.0")["val_loss"] >= 1.2 * I(m, "0.02")["val_loss"]]),
          needs=lambda m: learned(I(m, "0.02")["val_loss"], "the std 0.02 model")),
    Claim("Attention dropout narrows the train / validation gap on a small dataset",
          "gap (val - train loss) with dropout 0.1 <= 0.8 x the gap with dropout 0",
          lambda m: (f"gap: dropout 0 {fmt(D(m, '0.0')['gap'])} (train {fmt(D(m, '0.0')['train_loss'])}, val "
                     f"{fmt(D(m, '0.0')['val_loss'])}); dropout 0.1 {fmt(D(m, '0.1')['gap'])} (train "
                     f"{fmt(D(m, '0.1')['train_loss'])}, val {fmt(D(m, '0.1')['val_loss'])})",
                     [D(m, "0.1")["gap"] <= 0.8 * D(m, "0.0")["gap"]]),
          needs=lambda m: learned(D(m, "0.0")["train_loss"], "the model without dropout")),
    Claim("Positions added after the normalisation train less stably than positions that go through it",
          "at a high learning rate, LN(tok) + pos vs LN(tok + pos): final validation loss >= 1.02 x, or the "
          "largest gradient norm >= 1.5 x",
          lambda m: (f"after: loss {fmt(N(m, 'after')['val_loss'])}, max grad {fmt(N(m, 'after')['max_grad_norm'])}, "
                     f"{N(m, 'after')['spikes']} spikes; before: loss {fmt(N(m, 'before')['val_loss'])}, max grad "
                     f"{fmt(N(m, 'before')['max_grad_norm'])}, {N(m, 'before')['spikes']} spikes",
                     [N(m, "after")["val_loss"] >= 1.02 * N(m, "before")["val_loss"]
                      or N(m, "after")["max_grad_norm"] >= 1.5 * N(m, "before")["max_grad_norm"]]),
          needs=lambda m: learned(N(m, "before")["val_loss"], "the LN(tok + pos) model")),
    Claim("Trained short, tested long: the loss climbs past the training length (library default, RoPE)",
          "loss at 4L >= 1.1 x loss at L",
          lambda m: (", ".join(f"{k}: {fmt(v)}" for k, v in S(m).items()),
                     [list(S(m).values())[2] >= 1.1 * list(S(m).values())[0]]),
          needs=lambda m: learned(list(S(m).values())[0], "the model at its training length")),
]


@lab("pitfalls", "init scale, attention dropout, norm placement, short train / long test", sizes=SIZES,
     claims=CLAIMS)
def measure(p: dict, plots) -> dict:
    data = text_data(p["train_bytes"], 100_000)
    init, drop, norm, sl = init_runs(p, data), dropout_runs(p, data), norm_runs(p, data), short_long(p, data)
    with plots.figure("pitfalls", "pitfalls: training curves", ncols=2) as (a, b):
        for std, run in init.items():
            a.plot(run["loss"], lw=0.8, label=f"init std {std}")
        a.axhline(LN_V, ls=":", c="gray", label="ln(V)")
        a.set_yscale("log")
        a.set_xlabel("step")
        a.set_ylabel("training loss")
        a.legend(fontsize=7)
        for where, run in norm.items():
            b.plot(run["loss"], lw=0.8, label=f"positions {where} the norm")
        b.set_xlabel(f"step (lr {p['high_lr']}, no clipping)")
        b.set_ylabel("training loss")
        b.legend(fontsize=7)
    notes = [f"All models: width 64, 2 layers, 2 heads, {p['steps']} steps of {p['batch']} x {p['seq_len']} bytes.",
             f"Dropout: {p['small_bytes']} bytes of training text, {p['dropout_steps']} steps (many epochs); train "
             "loss measured on non-overlapping windows of that text in eval mode.",
             f"Norm placement: learning rate {p['high_lr']}, gradient clipping off; spikes = steps whose loss is "
             "1.2 x the previous step's.",
             "Short/long: non-overlapping validation windows, the same tokens at every length."]
    for run in (*init.values(), *norm.values()):
        run["loss"] = run["loss"][:: max(1, len(run["loss"]) // 150)]
    return {"init": init, "dropout": drop, "norm": norm, "short_long": sl, "log_vocab": LN_V, "notes": notes}
