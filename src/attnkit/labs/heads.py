"""Lab ``heads``: 1, 2, 4, 8, 16 heads at a fixed width.

Every model has width 64 (head dim 64 / H), the same depth, data, seed and steps. Measured: validation loss,
the median training step time, each head's normalised attention entropy, how different the heads of a
layer are (mean pairwise Jensen-Shannon divergence of their attention rows), and what removing heads at test
time costs: heads are ranked by how much the loss rises when each alone is removed (on one validation set),
then the least important 25 / 50 / 75% are removed together and the loss is measured on another set.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager

import torch

from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.metrics import head_metrics
from attnkit.labs.harness import evaluate, learned, seeded, text_data, tiny_lm, train
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim, fmt, timed_at_size


@contextmanager
def pruned(model, heads: set[tuple[int, int]]):
    """Zero the outputs of ``(layer, head)`` pairs before each layer's output projection while active."""
    handles = []
    for i, block in enumerate(model.blocks):
        attn = block.attn
        drop = [h for (layer, h) in heads if layer == i]
        if not drop:
            continue

        def hook(module, args, drop=drop, H=attn.num_heads, D=attn.head_dim):
            (x,) = args
            x = x.reshape(*x.shape[:-1], H, D).clone()  # (B, L, H, D)
            x[..., drop, :] = 0
            return (x.reshape(*x.shape[:-2], H * D),)  # (B, L, H*D)

        handles.append(attn.out_proj.register_forward_pre_hook(hook))
    try:
        yield model
    finally:
        for h in handles:
            h.remove()


def js_divergence(w: torch.Tensor) -> float:
    """Mean pairwise Jensen-Shannon divergence (nats) between the heads' rows of ``w (B, H, L, L)``."""
    H = w.shape[1]
    if H < 2:
        return float("nan")
    w = w[:, :, 1:].double().clamp_min(1e-12)  # (B, H, L-1, L): the first row has one key
    kl = lambda a, b: (a * (a / b).log()).sum(-1)  # noqa: E731
    vals = []
    for i, j in itertools.combinations(range(H), 2):
        mid = 0.5 * (w[:, i] + w[:, j])
        vals.append(float((0.5 * kl(w[:, i], mid) + 0.5 * kl(w[:, j], mid)).mean()))
    return sum(vals) / len(vals)


def head_stats(model, x) -> dict:
    with torch.no_grad(), capture(model) as cap:
        model(x)
    ent, div = [], []
    for r in cap.records:
        ent.append(head_metrics(r.weights, r.allowed).norm_entropy)
        div.append(js_divergence(r.weights))
    return {"norm_entropy": ent, "js_divergence": div}


def prune_curve(model, set_a, set_b, fractions) -> dict:
    base_a, base_b = evaluate(model, *set_a), evaluate(model, *set_b)
    heads = [(i, h) for i, b in enumerate(model.blocks) for h in range(b.attn.num_heads)]
    importance = {}
    for head in heads:
        with pruned(model, {head}):
            importance[f"{head[0]}.{head[1]}"] = evaluate(model, *set_a) - base_a
    order = sorted(heads, key=lambda hd: importance[f"{hd[0]}.{hd[1]}"])
    curve = {"0": base_b}
    for f in fractions:
        k = int(round(f * len(heads)))
        with pruned(model, set(order[:k])):
            curve[str(f)] = evaluate(model, *set_b)
    return {"importance": importance, "loss_after_pruning": curve, "base": base_b}


SIZES = {
    "default": {"heads": [1, 2, 4, 8, 16], "dim": 64, "layers": 2, "seq_len": 64, "batch": 16, "steps": 400,
                "lr": 3e-3, "train_bytes": 1_000_000, "eval_windows": 32, "prune_heads": 8,
                "fractions": [0.25, 0.5, 0.75]},
    "quick": {"heads": [1, 2, 4], "dim": 16, "layers": 1, "seq_len": 16, "batch": 4, "steps": 4, "lr": 3e-3,
              "train_bytes": 100_000, "eval_windows": 4, "prune_heads": 4, "fractions": [0.25, 0.5, 0.75]},
}

R = lambda m, h: m["runs"][str(h)]  # noqa: E731
#: the step-time claim is judged only from this width on (narrower steps time the per-op overhead)
SPEED_FROM_WIDTH = 64
SOME_LEARNED = lambda m: learned(min(R(m, h)["val_loss"] for h in m["heads"]), "the best head count")  # noqa: E731
PRUNED_LEARNED = lambda m: learned(m["prune"]["base"], f"the {m['prune_heads']}-head model")  # noqa: E731

CLAIMS = [
    Claim("Several heads beat one head of the same total width",
          "the best validation loss among 2, 4 and 8 heads <= 0.98 x the 1-head loss",
          lambda m: (", ".join(f"H={h} {fmt(R(m, h)['val_loss'])}" for h in m["heads"]),
                     [min(R(m, h)["val_loss"] for h in m["heads"] if 1 < h <= 8) <= 0.98 * R(m, 1)["val_loss"]]),
          needs=SOME_LEARNED),
    Claim("Too many heads leave each too small a head dimension (here 16 heads of dim 4)",
          "16-head validation loss >= 1.02 x the best loss of any head count",
          lambda m: (f"H={max(m['heads'])} {fmt(R(m, max(m['heads']))['val_loss'])} vs best "
                     f"{fmt(min(R(m, h)['val_loss'] for h in m['heads']))}",
                     [R(m, max(m["heads"]))["val_loss"] >= 1.02 * min(R(m, h)["val_loss"] for h in m["heads"])]),
          needs=SOME_LEARNED),
    Claim("More heads at a fixed width cost little extra time (same FLOPs, smaller matmuls)",
          "median step time with the most heads <= 1.5 x with one head",
          lambda m: (", ".join(f"H={h} {fmt(R(m, h)['step_ms'])} ms" for h in m["heads"]),
                     [R(m, max(m["heads"]))["step_ms"] <= 1.5 * R(m, 1)["step_ms"]]),
          needs=lambda m: timed_at_size(m["width"], SPEED_FROM_WIDTH, "the model width")),
    Claim("Heads specialise: different heads of a layer attend differently",
          "mean pairwise Jensen-Shannon divergence between heads of the pruned model >= 0.05 nats",
          lambda m: (f"H={m['prune_heads']}: JS per layer "
                     + ", ".join(fmt(v) for v in R(m, m["prune_heads"])["js_divergence"]),
                     [sum(R(m, m["prune_heads"])["js_divergence"]) / len(R(m, m["prune_heads"])["js_divergence"])
                      >= 0.05]),
          needs=PRUNED_LEARNED),
    Claim("Most heads can be pruned at test time (Voita et al.; Michel et al.)",
          "removing the least important 50% of the heads raises the validation loss by <= 5%",
          lambda m: (f"H={m['prune_heads']}: loss {fmt(m['prune']['base'])} -> "
                     f"{fmt(m['prune']['loss_after_pruning']['0.5'])} with half the heads removed; 25%: "
                     f"{fmt(m['prune']['loss_after_pruning']['0.25'])}, 75%: "
                     f"{fmt(m['prune']['loss_after_pruning']['0.75'])}",
                     [m["prune"]["loss_after_pruning"]["0.5"] <= 1.05 * m["prune"]["base"]]),
          needs=PRUNED_LEARNED),
]


@lab("heads", "how many heads at a fixed width", sizes=SIZES, claims=CLAIMS)
def measure(p: dict, plots) -> dict:
    data = text_data(p["train_bytes"], 100_000)
    L = p["seq_len"]
    wx, wy = data.eval_windows(L, 2 * p["eval_windows"] * L)
    set_a, set_b = (wx[: p["eval_windows"]], wy[: p["eval_windows"]]), (wx[p["eval_windows"]:], wy[p["eval_windows"]:])
    runs, prune = {}, None
    for H in p["heads"]:
        seeded(p["seed"])
        model = tiny_lm(embed_dim=p["dim"], num_layers=p["layers"], num_heads=H, max_seq_len=L)
        hist = train(model, data.sampler(p["batch"], L), steps=p["steps"], lr=p["lr"], seed=p["seed"])
        runs[str(H)] = {"val_loss": evaluate(model, *set_b), "step_ms": hist.median_step_ms(),
                        "params": sum(q.numel() for q in model.parameters()), **head_stats(model, set_a[0][:8])}
        if p["prune_heads"] == H:
            prune = prune_curve(model, set_a, set_b, p["fractions"])
    with plots.figure("heads", f"width {p['dim']}, {p['layers']} layers, text L={L}", ncols=2) as (a, b):
        hs = p["heads"]
        a.plot(hs, [runs[str(h)]["val_loss"] for h in hs], "-o", ms=3)
        a.set_xscale("log", base=2)
        a.set_xlabel("heads (head dim = width / heads)")
        a.set_ylabel("validation loss (nats)")
        fr = [0.0, *p["fractions"]]
        b.plot([100 * f for f in fr], [prune["loss_after_pruning"][str(f) if f else "0"] for f in fr], "-o", ms=3)
        b.set_xlabel(f"% of the {p['prune_heads']}-head model's heads removed (least important first)")
        b.set_ylabel("validation loss (nats)")
    notes = [f"{len(p['heads'])} models of width {p['dim']}, {p['layers']} layers, {p['steps']} steps of "
             f"{p['batch']} x {L} bytes; validation on {p['eval_windows']} windows (a second, disjoint set ranks heads"
             " for pruning).",
             "Step times are medians over training steps on a shared machine: read them as ratios."]
    return {"heads": p["heads"], "width": p["dim"], "runs": runs, "prune": prune, "prune_heads": p["prune_heads"],
            "notes": notes}
