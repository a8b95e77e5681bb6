"""Lab ``mask``: the mask before vs after the softmax, and the ``-1e9`` constant in low precision.

Three parts. (1) On random scores: row sums and how much the outputs depend on future keys when the causal
mask is applied after the softmax (``softmax(s) * mask``) instead of before (``softmax(where(mask, s, -inf))``).
(2) Two models trained on byte-level text, one with the bug: the loss the way they were trained (teacher
forcing: every position in one causal pass) against the loss when each position sees only its prefix - what
generation sees - and a greedy sample of each. (3) ``-1e9`` and ``finfo.min`` masks in float32 / float16 /
bfloat16 on rows that are fully masked (left padding under a causal mask), against attnkit's boolean mask.
"""

from __future__ import annotations

import torch

from attnkit.backends import attention
from attnkit.functional.reference import reference_attention
from attnkit.labs.harness import IGNORE, evaluate, learned, seeded, text_data, tiny_lm, train
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim, fmt
from attnkit.labs.variants import lab_attention, mask_after_softmax
from attnkit.runs.tokens import ByteTokenizer

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def placement(L: int, D: int = 16) -> dict:
    """Row sums and the future-dependence of outputs, mask before vs after the softmax (float64)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(4, 2, L, D, generator=g, dtype=torch.float64) for _ in range(3))  # (B, H, L, D)
    allowed = torch.ones(L, L, dtype=torch.bool).tril()
    scores = q @ k.transpose(-2, -1) / D ** 0.5  # (B, H, L, L)
    before = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    after = scores.softmax(-1).masked_fill(~allowed, 0.0)
    k2 = k.clone()
    k2[..., L // 2:, :] += torch.randn(k2[..., L // 2:, :].shape, generator=g, dtype=torch.float64)  # new future
    rows = slice(0, L // 2)  # queries that must not see keys >= L/2
    with torch.no_grad():
        dep = {name: float((fn(q, k2, v) - fn(q, k, v))[..., rows, :].abs().max())
               for name, fn in (("before", lambda a, b, c: reference_attention(a, b, c, allowed)),
                                ("after", mask_after_softmax))}
    return {"row_sum_before": [float(before.sum(-1).min()), float(before.sum(-1).max())],
            "row_sum_after": [float(after.sum(-1).min()), float(after.sum(-1).mean())],
            "future_dependence": dep}


@torch.no_grad()
def prefix_loss(model, inputs: torch.Tensor, targets: torch.Tensor) -> float:
    """Loss when position t is predicted from tokens <= t only (one forward per prefix, like generation)."""
    total, count = 0.0, 0
    for t in range(1, inputs.shape[1] + 1):
        logits = model(inputs[:, :t])[:, -1].float()  # (B, V)
        total += float(torch.nn.functional.cross_entropy(logits, targets[:, t - 1], reduction="sum"))
        count += targets.shape[0]
    return total / count


@torch.no_grad()
def greedy(model, prompt: str, n: int) -> str:
    tok = ByteTokenizer()
    ids = torch.tensor([tok.encode(prompt)])
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tok.decode(ids[0].tolist())


def train_pair(p: dict) -> dict:
    data = text_data(p["train_bytes"], 100_000)
    x, y = data.eval_windows(p["seq_len"], p["eval_windows"] * p["seq_len"])
    out = {}
    for name, kind in (("correct", "softmax"), ("after", lab_attention("mask-after-softmax",
                                                                        kernel=mask_after_softmax))):
        seeded(p["seed"])
        model = tiny_lm(num_layers=2, max_seq_len=p["seq_len"], positions="rope", attention=kind)
        hist = train(model, data.sampler(p["batch"], p["seq_len"]), steps=p["steps"], lr=p["lr"], seed=p["seed"])
        out[name] = {"loss": hist.loss, "teacher_forced": evaluate(model, x, y), "prefix": prefix_loss(model, x, y),
                     "sample": greedy(model, "def ", p["sample_tokens"])}
    return out


def masked_scores(scores: torch.Tensor, allowed: torch.Tensor, method: str) -> torch.Tensor:
    """The score matrix under each way of writing a mask (scores in their low-precision dtype)."""
    dtype = scores.dtype
    if method == "masked_fill(-1e9)":
        return scores.masked_fill(~allowed, -1e9)
    if method == "+ (-1e9) float mask":  # built in float32, cast with the model (model.half() casts buffers)
        return scores + torch.zeros(scores.shape).masked_fill(~allowed, -1e9).to(dtype)
    # causal and padding as two additive planes of finfo.min, summed where both mask a key
    causal, padding = allowed
    plane = lambda keep: torch.zeros_like(scores).masked_fill(~keep, torch.finfo(dtype).min)  # noqa: E731
    return scores + plane(causal) + plane(padding)


def constants(L: int, pad: int, D: int = 16) -> dict:
    """NaN rows, masked mass and error vs float64 per dtype and masking method (left padding + causal)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, L, D, generator=g, dtype=torch.float64) for _ in range(3))
    real = torch.ones(2, L, dtype=torch.bool)
    real[1, :pad] = False  # row 1 is left-padded: its first `pad` queries see only padding
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None, None]  # (1, 1, L, L)
    padding = real[:, None, None, :]  # (B, 1, 1, L)
    allowed = causal & padding  # (B, 1, L, L)
    has_key = allowed.any(-1, keepdim=True)  # (B, 1, L, 1)
    golden = reference_attention(q, k, v, allowed)  # (B, H, L, D): zeros on fully masked rows
    results = {}
    for dname, dtype in DTYPES.items():
        qd, kd, vd = q.to(dtype), k.to(dtype), v.to(dtype)
        scores = (qd @ kd.transpose(-2, -1)) * D ** -0.5  # (B, H, L, L) in dtype
        for method in ("masked_fill(-1e9)", "+ (-1e9) float mask", "two finfo.min planes"):
            arg = (causal, padding) if method == "two finfo.min planes" else allowed
            try:
                masked = masked_scores(scores, arg, method)
                probs = masked.softmax(-1)  # in dtype, like hand-written attention
            except RuntimeError as exc:  # torch refuses masked_fill(-1e9) on float16
                results[f"{dname} {method}"] = {"raises": str(exc).splitlines()[0], "nan_rows": 0}
                continue
            out = probs @ vd
            nan_rows = torch.isnan(out).any(-1)  # (B, H, L)
            empty = ~has_key[..., 0].expand_as(nan_rows)  # fully masked rows
            masked_mass = torch.where(allowed, 0.0, probs.double()).sum(-1)  # (B, H, L)
            valid = (~empty) & (~nan_rows)
            err = (out.double() - golden).abs().amax(-1)[valid]
            results[f"{dname} {method}"] = {
                "nan_rows": int(nan_rows.sum()), "rows": nan_rows.numel(), "empty_rows": int(empty.sum()),
                "inf_entries": int(torch.isinf(masked).sum()),
                "masked_mass_on_empty_rows": float(masked_mass[empty & ~nan_rows].mean())
                if bool((empty & ~nan_rows).any()) else 0.0,
                "max_err_valid_rows": float(err.max()) if err.numel() else 0.0}
        out = attention(qd, kd, vd, allowed)
        results[f"{dname} attnkit bool mask"] = {
            "nan_rows": int(torch.isnan(out).any(-1).sum()), "rows": out.shape[0] * out.shape[1] * L,
            "empty_rows": int((~has_key).sum()) * 2, "masked_mass_on_empty_rows": 0.0,
            "max_err_valid_rows": float((out.double() - golden).abs().max())}
    return results


SIZES = {
    "default": {"L": 32, "pad": 6, "seq_len": 48, "batch": 16, "steps": 500, "lr": 3e-3, "train_bytes": 1_000_000,
                "eval_windows": 16, "sample_tokens": 60},
    "quick": {"L": 16, "pad": 4, "seq_len": 16, "batch": 4, "steps": 8, "lr": 3e-3, "train_bytes": 100_000,
              "eval_windows": 2, "sample_tokens": 8},
}

C = lambda m, key: m["constants"][key]  # noqa: E731
CORRECT_LEARNED = lambda m: learned(m["train"]["correct"]["teacher_forced"], "the correct model")  # noqa: E731

CLAIMS = [
    Claim("Masking after the softmax leaves rows that do not sum to 1",
          "after: smallest row sum <= 0.5; before: every row sums to 1 within 1e-9",
          lambda m: (f"after: row sums min {fmt(m['placement']['row_sum_after'][0])}, mean "
                     f"{fmt(m['placement']['row_sum_after'][1])}; before: {fmt(m['placement']['row_sum_before'][0], 10)}"
                     f"..{fmt(m['placement']['row_sum_before'][1], 10)}",
                     [m["placement"]["row_sum_after"][0] <= 0.5,
                      abs(m["placement"]["row_sum_before"][0] - 1) <= 1e-9
                      and abs(m["placement"]["row_sum_before"][1] - 1) <= 1e-9])),
    Claim("After the softmax, the normaliser reads future keys: outputs change when the future changes",
          "max |change| of past outputs when future keys change: after >= 1e-3; before <= 1e-12 (float64)",
          lambda m: (f"after {fmt(m['placement']['future_dependence']['after'])}, before "
                     f"{fmt(m['placement']['future_dependence']['before'])}",
                     [m["placement"]["future_dependence"]["after"] >= 1e-3,
                      m["placement"]["future_dependence"]["before"] <= 1e-12])),
    Claim("A model trained with the bug looks better in training than it is at generation time",
          "bug: prefix-only (generation) loss >= 1.05 x its teacher-forced loss; correct model: the two within 1%",
          lambda m: (f"bug {fmt(m['train']['after']['teacher_forced'])} teacher-forced vs "
                     f"{fmt(m['train']['after']['prefix'])} prefix; correct {fmt(m['train']['correct']['teacher_forced'])}"
                     f" vs {fmt(m['train']['correct']['prefix'])}",
                     [m["train"]["after"]["prefix"] >= 1.05 * m["train"]["after"]["teacher_forced"],
                      abs(m["train"]["correct"]["prefix"] / m["train"]["correct"]["teacher_forced"] - 1) <= 0.01]),
          needs=CORRECT_LEARNED),
    Claim("At generation time the buggy model is worse than the correct one",
          "prefix-only loss: bug >= 1.05 x correct",
          lambda m: (f"bug {fmt(m['train']['after']['prefix'])} vs correct {fmt(m['train']['correct']['prefix'])}",
                     [m["train"]["after"]["prefix"] >= 1.05 * m["train"]["correct"]["prefix"]]),
          needs=CORRECT_LEARNED),
    Claim("-1e9 overflows float16 to -inf, and fully masked rows turn NaN; a boolean mask with a safe softmax "
          "does not",
          "float16 scores + a -1e9 float mask cast to float16: NaN rows > 0; attnkit bool mask: 0 NaN rows in "
          "float32, float16, bfloat16",
          lambda m: (f"float16 + -1e9 mask: {C(m, 'float16 + (-1e9) float mask')['nan_rows']} NaN rows of "
                     f"{C(m, 'float16 + (-1e9) float mask')['rows']} (masked_fill(-1e9) on float16: "
                     f"{C(m, 'float16 masked_fill(-1e9)').get('raises', 'no error')}); attnkit: "
                     + ", ".join(f"{d} {C(m, d + ' attnkit bool mask')['nan_rows']}" for d in DTYPES),
                     [C(m, "float16 + (-1e9) float mask")["nan_rows"] > 0,
                      all(C(m, d + " attnkit bool mask")["nan_rows"] == 0 for d in DTYPES)])),
    Claim("In bfloat16 and float32 -1e9 does not overflow, but a fully masked row then attends uniformly to "
          "masked keys (silent garbage instead of NaN)",
          "bfloat16 and float32 masked_fill(-1e9): 0 NaN rows and mass on masked keys of empty rows >= 0.99",
          lambda m: ("; ".join(f"{d}: {C(m, d + ' masked_fill(-1e9)')['nan_rows']} NaN rows, masked mass "
                               f"{fmt(C(m, d + ' masked_fill(-1e9)')['masked_mass_on_empty_rows'])}"
                               for d in ("bfloat16", "float32")),
                     [C(m, d + " masked_fill(-1e9)")["nan_rows"] == 0
                      and C(m, d + " masked_fill(-1e9)")["masked_mass_on_empty_rows"] >= 0.99
                      for d in ("bfloat16", "float32")])),
    Claim("Summing two finfo.min mask planes overflows to -inf in every dtype",
          "two finfo.min planes: -inf score entries > 0 in float32, float16 and bfloat16",
          lambda m: (", ".join(f"{d} {C(m, d + ' two finfo.min planes')['inf_entries']} -inf entries, "
                               f"{C(m, d + ' two finfo.min planes')['nan_rows']} NaN rows" for d in DTYPES),
                     [C(m, d + " two finfo.min planes")["inf_entries"] > 0 for d in DTYPES])),
]


@lab("mask", "mask before vs after the softmax; -1e9 in low precision", sizes=SIZES, claims=CLAIMS)
def measure(p: dict, plots) -> dict:
    place = placement(p["L"])
    runs = train_pair(p)
    consts = constants(p["L"], p["pad"])
    with plots.figure("training", f"text, L={p['seq_len']}: teacher-forced vs prefix-only loss", ncols=2) as (a, b):
        for name, run in runs.items():
            a.plot(run["loss"], lw=0.8, label=f"mask {'before' if name == 'correct' else 'after'} softmax")
        a.set_xlabel("step")
        a.set_ylabel("training loss (nats)")
        a.legend(fontsize=8)
        names = list(runs)
        xs = range(len(names))
        b.bar([i - 0.2 for i in xs], [runs[n]["teacher_forced"] for n in names], 0.4, label="teacher-forced")
        b.bar([i + 0.2 for i in xs], [runs[n]["prefix"] for n in names], 0.4, label="prefix only (generation)")
        b.set_xticks(list(xs), ["before softmax", "after softmax"])
        b.set_ylabel("validation loss (nats)")
        b.legend(fontsize=8)
    notes = [f"Placement: 4 x 2 heads of random q, k, v (float64), L={p['L']}, causal; future = keys >= L/2 "
             "re-drawn.",
             f"Training: two 2-layer width-64 RoPE models, {p['steps']} steps of {p['batch']} x {p['seq_len']} "
             f"bytes; validation on {p['eval_windows']} windows. Greedy samples from 'def ': correct "
             f"{runs['correct']['sample']!r}; bug {runs['after']['sample']!r}.",
             f"Constants: q, k, v of 2 x 2 heads, L={p['L']}, row 1 left-padded by {p['pad']} (its first {p['pad']} "
             "queries see only padding); softmax computed in the dtype, as hand-written attention does."]
    return {"placement": place, "train": runs, "constants": consts, "notes": notes, "ignore_index": IGNORE}
