"""The attention of generated tokens (``report(..., generate=N)``, ``attnkit report TARGET --generate N``): the
model continues the text greedily for N tokens, and for each new token the page shows which earlier tokens the
query that produced it attended to, in every layer and head (BertViz users' question: "where did it look when it
wrote this word?").

Step ``s`` (0-based) is the token at position ``P + s`` (P prompt tokens); the query that produced it sits at
position ``P + s - 1`` and sees keys ``0 .. P + s - 1`` (what its mask allows). The rows come from one forward of
the prompt and the first N - 1 new tokens with :class:`attnkit.diagnostics.capture` selecting those query rows: in
a causal model a row of the full forward is the row the cached decoding step computes (the doctor's ``kv-cache``
check), so nothing is re-derived. The new tokens are the argmax of the logits at each step (a plain loop of full
forwards: the same for attnkit and transformers models; an end token does not stop it, the page marks it).

Size: ``layers x heads x N x (P + N - 1)`` bytes (one byte per weight, step 1/255). Past ``budget`` bytes (default
4 MiB) each row keeps its ``top_k`` largest weights and the mass it leaves out, as the main view does past
``dense_max``.

Shape legend: H query heads, N new tokens, K = P + N - 1 keys, k = top_k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from attnkit._checks import positive_int
from attnkit.errors import AttnkitValueError

BUDGET = 4 * 1024 * 1024  #: bytes of generated-token rows kept densely; past it, top-k per row


@dataclass
class Generated:
    """``rows[l]``: ``(H, N, K)`` float32, row ``s`` = the query producing new token ``s`` over keys ``0..K-1``."""

    prompt_len: int
    tokens: list[int]  # P + N ids
    labels: list[str]  # one per token
    layer_names: list[str]
    rows: list[torch.Tensor]

    @property
    def steps(self) -> int:
        return len(self.tokens) - self.prompt_len


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    from attnkit.diagnostics.importance import _logits as logits_of

    return logits_of(model, ids)  # (1, L, V)


def check_generate(model: nn.Module, n: int, prompt_len: int, max_tokens: int) -> None:
    """Refuse what can't be generated before anything runs: ``n`` a positive int, a causal LM, the whole sequence
    within ``max_tokens`` and the model's positions."""
    from attnkit.diagnostics.importance import _causal
    from attnkit.diagnostics.report import trained_length

    positive_int(n, "generate", "new tokens to follow, e.g. generate=32.")
    if _causal(model) is False:
        raise AttnkitValueError(f"generate={n} needs a causal language model; {type(model).__name__} is an encoder "
                                "(it attends both ways and predicts no next token): leave generate out.")
    total = prompt_len + n
    if total > max_tokens:
        raise AttnkitValueError(f"the text ({prompt_len} tokens) and generate={n} make {total} tokens, more than "
                                f"max_tokens={max_tokens}; generate fewer tokens or shorten the text.")
    limit = trained_length(model)
    if limit is not None and total > limit:
        raise AttnkitValueError(f"the text ({prompt_len} tokens) and generate={n} make {total} tokens, more than the "
                                f"{limit} positions {type(model).__name__} has; generate at most {limit - prompt_len}.")


@torch.no_grad()
def greedy(model: nn.Module, ids: torch.Tensor, n: int) -> torch.Tensor:
    """``(1, P) -> (1, P + n)``: each new token the argmax of the logits at the last position."""
    for _ in range(n):
        next_id = _logits(model, ids)[0, -1].argmax()
        ids = torch.cat([ids, next_id.view(1, 1).to(ids.dtype)], dim=1)
    return ids


def collect_generated(model: nn.Module, ids: torch.Tensor, n: int, label_of) -> Generated:
    """Generate ``n`` tokens after ``ids (1, P)`` and capture, per attention layer, the rows of the queries that
    produced them (see the module docstring). ``label_of(id) -> str`` labels the new tokens."""
    from attnkit.diagnostics.capture import capture
    from attnkit.diagnostics.layer_kinds import model_layers
    from attnkit.diagnostics.report.collect import _forward, _hf_switch, _is_hf

    was_training = model.training
    model.eval()
    P = ids.shape[1]
    restore, used = _hf_switch(model)
    try:
        full = greedy(model, ids, n)  # (1, P + n)
        feed = full[:, :P + n - 1]  # the last new token's own query is not needed
        with torch.no_grad(), capture(model, rows=list(range(P - 1, P + n - 1))) as cap:
            _forward(model, feed, used)
    finally:
        model.train(was_training)
        if restore is not None and restore != used:
            model.set_attn_implementation(restore)
    calls = cap.by_layer()
    if not calls:
        raise AttnkitValueError(f"no attention calls were seen while running {type(model).__name__} on the generated "
                                "tokens: its attention does not go through attnkit.attention.")
    attending = [x for x in (model_layers(model) or []) if x.attends]
    names, rows = [], []
    for i, (name, records) in enumerate(calls.items()):
        if _is_hf(model) and name.startswith("call"):
            name = attending[i].name if len(attending) == len(calls) else f"layer {i}"
        names.append(name)
        rows.append(records[-1].weights[0].float().cpu())  # (H, N, K)
    tokens = full[0].tolist()
    return Generated(P, tokens, [label_of(t) for t in tokens], names, rows)


def encode_generated(buf, gen: Generated, *, budget: int = BUDGET, top_k: int = 32) -> dict:
    """The page's ``meta["generated"]``: per layer and head the ``(N, K)`` rows as bytes (dense), or past
    ``budget`` bytes the ``top_k`` largest of each row with the rest of its mass."""
    from attnkit.diagnostics.report.encode import quantise

    N, K = gen.steps, len(gen.tokens) - 1
    size = sum(r.shape[0] for r in gen.rows) * N * K
    sparse = size > budget and top_k < K
    layers = []
    for name, w in zip(gen.layer_names, gen.rows):  # (H, N, K)
        heads = []
        if not sparse:
            dense = quantise(w)
            heads = [{"fmt": "dense", "w": buf.add(dense[h])} for h in range(w.shape[0])]
        else:
            values, index = w.topk(top_k, dim=-1)  # (H, N, k)
            rest = quantise((1.0 - values.double().sum(-1)).clamp_min(0))  # (H, N)
            index, values = index.numpy().astype("<u2"), quantise(values)
            heads = [{"fmt": "topk", "k": top_k, "idx": buf.add(index[h]), "val": buf.add(values[h]),
                      "rest": buf.add(rest[h])} for h in range(w.shape[0])]
        layers.append({"name": name, "H": w.shape[0], "heads": heads})
    return {"P": gen.prompt_len, "N": N, "K": K, "ids": gen.tokens, "labels": gen.labels, "layers": layers,
            "sparse_top_k": top_k if sparse else None, "bytes": int(size)}


def decode_rows(blob: bytes, head: dict, N: int, K: int) -> np.ndarray:
    """The ``(N, K)`` weights a page shows for one head's generated rows (sparse: zeros outside the top-k)."""
    from attnkit.diagnostics.report.encode import STEP

    def view(span, dtype):
        offset, size = span
        return np.frombuffer(blob[offset:offset + size], dtype=dtype)

    if head["fmt"] == "dense":
        return view(head["w"], np.uint8).reshape(N, K) * STEP
    out = np.zeros((N, K))
    idx = view(head["idx"], "<u2").reshape(N, head["k"]).astype(np.int64)
    np.put_along_axis(out, idx, view(head["val"], np.uint8).reshape(N, head["k"]) * STEP, axis=-1)
    return out


__all__ = ["BUDGET", "Generated", "check_generate", "collect_generated", "decode_rows", "encode_generated", "greedy"]
