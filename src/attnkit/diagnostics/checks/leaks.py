"""Information leaks: causal (the future), padding (pad contents and amount), packing (other documents).

Each check changes what must not matter and measures, in float64 (or the most precise dtype the model runs:
``base.precise``), how much the outputs that must not see it moved.

Shape legend: B batch, H heads, L length, E embed_dim, D head_dim, V vocab size.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from attnkit.diagnostics.checks.base import (
    FAIL,
    INFO,
    PASS,
    WARN,
    Outcome,
    Skip,
    causal_mask,
    check,
    first_bad_position,
    fn_inputs,
    gen,
    max_diff,
    model_device,
    precise,
    tokens_for,
    tolerance,
    x_inputs,
)
from attnkit.diagnostics.departures import LEFT_PADDING, untested


@contextlib.contextmanager
def embedding_probe(module: nn.Module, tokens_shape: torch.Size):
    """Make the token embeddings ``(B, L, E)`` of the next forward leaves with gradients; yields the list
    that receives them (one per embedding lookup of a ``(B, L)`` id tensor)."""
    found: list[torch.Tensor] = []

    def hook(mod, args, output):
        if args and isinstance(args[0], torch.Tensor) and args[0].shape == tokens_shape and not found:
            leaf = output.detach().requires_grad_(True)
            found.append(leaf)
            return leaf
        return None

    handles = [m.register_forward_hook(hook) for m in module.modules() if isinstance(m, nn.Embedding)]
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


def _verdict(past: float, future: float, grad: float | None, tol: float, where: int | None, what: str,
             note: str = "") -> Outcome:
    grad_text = "" if grad is None else f", max |d earlier / d future| {grad:.1e}"
    details = {"past_change": past, "future_change": future, "future_grad": grad, "tol": tol}
    if past > tol or (grad is not None and grad > tol):
        at = f" first at position {where}" if where is not None else ""
        return Outcome(FAIL, f"{what}: earlier outputs changed by {past:.2e}{at}{grad_text} (tol {tol:.0e}){note}",
                       details)
    if future <= tol:
        return Outcome(WARN, f"outputs do not depend on their own inputs at all (change {future:.1e}): check is vacuous"
                       + note, details)
    return Outcome(PASS, f"changing tokens >= t leaves outputs < t unchanged ({past:.1e}){grad_text}{note}", details)


@check("causal-leak", "causal leak",
       "Mask future keys before the softmax: a query at position p sees keys at positions <= p (torch.tril / "
       "ak.masks.causal(), not triu(..., 1) or an off-by-one diagonal); with a cache align it bottom-right.", order=10)
def causal_leak(subject, options) -> Outcome:
    t = options.seq_len // 2
    L = options.seq_len
    if subject.lm is not None:
        if not subject.lm.causal:
            raise Skip("bidirectional encoder: causality does not apply")
        probe = precise(subject, options)
        s = probe.subject
        g = gen(options, 1)
        tokens = tokens_for(s.lm.vocab_size, options.batch, L, g, model_device(s))
        changed = tokens.clone()
        changed[:, t:] = tokens_for(s.lm.vocab_size, options.batch, L - t, g, tokens.device)
        with embedding_probe(s.module, tokens.shape) as leaves:
            out = s.lm.per_position(tokens)  # (B, L, E|V): hidden states when the model has them
        grad = None
        if leaves:
            out[:, :t].sum().backward()
            grad = float(leaves[0].grad[:, t:].abs().max())
        with torch.no_grad():
            out2 = s.lm.per_position(changed)
        out = out.detach()
        tol = tolerance(out)
        what = "hidden states" if s.lm.hidden is not None else "logits"
        return _verdict(max_diff(out[:, :t], out2[:, :t]), max_diff(out[:, t:], out2[:, t:]), grad, tol,
                        first_bad_position(out[:, :t], out2[:, :t], 1, tol), f"future tokens leak into earlier {what}",
                        probe.note)
    if subject.seq is not None:
        probe = precise(subject, options)
        s = probe.subject
        x = x_inputs(s, options, L, dtype=probe.dtype).requires_grad_(True)
        mask = causal_mask(L, x.device)
        out = s.seq(x, mask)
        out[:, :t].sum().backward()
        changed = x.detach().clone()
        changed[:, t:] = x_inputs(s, options, L - t, offset=2, dtype=probe.dtype)
        out2 = s.seq(changed, mask).detach()
        out = out.detach()
        tol = tolerance(out)
        return _verdict(max_diff(out[:, :t], out2[:, :t]), max_diff(out[:, t:], out2[:, t:]),
                        float(x.grad[:, t:].abs().max()), tol, first_bad_position(out[:, :t], out2[:, :t], 1, tol),
                        "with a causal mask, future inputs leak into earlier outputs", probe.note)
    if subject.fn is not None:
        q, k, v = (a.requires_grad_(True) for a in fn_inputs(options))
        mask = causal_mask(L)
        out = subject.fn(q, k, v, mask)
        out[:, :, :t].sum().backward()
        grad = max(float(a.grad[:, :, t:].abs().max()) for a in (q, k, v))
        q2, k2, v2 = (a.detach().clone() for a in (q, k, v))
        for a, b in zip((q2, k2, v2), fn_inputs(options, offset=3)):
            a[:, :, t:] = b[:, :, t:]
        out2 = subject.fn(q2, k2, v2, mask).detach()
        out = out.detach()
        tol = tolerance(out)
        return _verdict(max_diff(out[:, :, :t], out2[:, :, :t]), max_diff(out[:, :, t:], out2[:, :, t:]), grad, tol,
                        first_bad_position(out[:, :, :t], out2[:, :, :t], 2, tol),
                        "with a causal mask, future keys/values leak into earlier outputs")
    raise Skip("needs an attention function, a module or a token model")


# --------------------------------------------------------------------------------------------- padding

def _padding_outcome(results: dict[str, float], tol: float, notes: list[str], spared: list[str] = ()) -> Outcome:
    """FAIL on any change over ``tol``; INFO when a departure of the config spared a probe (``spared``: why)."""
    bad = {k: v for k, v in results.items() if v > tol}
    extra = f" ({'; '.join(notes)})" if notes else ""
    details = {"changes": results, "tol": tol, "not_compared": list(spared)}
    if bad:
        worst = max(bad, key=bad.get)
        return Outcome(FAIL, f"padding leaks into real outputs: {worst} changes them by {bad[worst]:.2e} (tol {tol:.0e})"
                       + extra, details)
    text = f"real outputs unchanged by {', '.join(results)} (max {max(results.values()):.1e}){extra}"
    if spared:
        return Outcome(INFO, text + "; " + "; ".join(spared), details)
    return Outcome(PASS, text, details)


def _padding_lm(subject, options) -> Outcome:
    """A token model: real tokens alone vs padded right (and left, with positions that skip the pads). Positions
    are passed to every run when the model takes them, so a model that derives positions from which tokens are
    padding (RoBERTa) is compared at the same positions: the probe changes the padding, never the positions."""
    n = options.seq_len - 2  # real tokens
    notes: list[str] = []
    results: dict[str, float] = {}
    probe = precise(subject, options)
    s = probe.subject
    g = gen(options, 4)
    dev = model_device(s)
    tokens = tokens_for(s.lm.vocab_size, options.batch, n, g, dev)
    takes = s.lm.supports_positions

    def run(ids, key_is_real=None, positions=None):
        if takes and positions is None:
            positions = torch.arange(ids.shape[1], device=dev)[None]  # (1, L)
        return s.lm.per_position(ids, key_is_real=key_is_real, positions=positions if takes else None)

    with torch.no_grad():
        base = run(tokens)  # (B, n, E|V)
    sides, spared = _sides(subject, takes, notes)
    with torch.no_grad():
        for side in sides:
            for p in (2, 3):  # amounts of padding, random pad contents each time
                pads = tokens_for(s.lm.vocab_size, options.batch, p, g, dev)
                real = torch.ones(options.batch, n, dtype=torch.bool, device=dev)
                fake = torch.zeros(options.batch, p, dtype=torch.bool, device=dev)
                if side == "right":
                    out = run(torch.cat([tokens, pads], 1), torch.cat([real, fake], 1))[:, :n]
                else:
                    key_is_real = torch.cat([fake, real], 1)  # (B, p + n)
                    positions = (key_is_real.long().cumsum(1) - 1).clamp_min(0)  # (B, p + n)
                    out = run(torch.cat([pads, tokens], 1), key_is_real, positions)[:, p:]
                results[f"{side} padding x{p}"] = max_diff(out, base)
    if probe.note:
        notes.append(probe.note.strip(" ()"))
    return _padding_outcome(results, tolerance(base), notes, spared)


def _sides(subject, takes_positions: bool, notes: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """The sides to pad a token model on, and why left padding is not compared when a departure says so."""
    if not takes_positions:
        notes.append("left padding not tested: the model takes no positions")
        return ("right",), []
    spared = [f"left padding not compared: {d.untested[LEFT_PADDING]}"
              for d in untested(subject.module, LEFT_PADDING)] if subject.module is not None else []
    return (("right",) if spared else ("right", "left")), spared


def _padding_seq(subject, options) -> Outcome:
    """A sequence module: its outputs on the real inputs alone vs padded right and left."""
    n = options.seq_len - 2  # real tokens
    notes: list[str] = []
    results: dict[str, float] = {}
    probe = precise(subject, options)
    s = probe.subject
    x = x_inputs(s, options, n, dtype=probe.dtype)
    base = s.seq(x, None).detach()
    with torch.no_grad():
        for side in ("right", "left"):
            amounts = (2, 3) if side == "right" or s.seq_positions else (2, 2)
            for i, p in enumerate(amounts):
                pads = x_inputs(s, options, p, offset=10 + i, dtype=probe.dtype)
                real = torch.ones(options.batch, n, dtype=torch.bool, device=x.device)
                fake = torch.zeros(options.batch, p, dtype=torch.bool, device=x.device)
                is_real = torch.cat([real, fake] if side == "right" else [fake, real], 1)  # (B, n + p)
                mask = is_real[:, None, None, :]  # (B, 1, 1, Lk)
                xp = torch.cat([x, pads] if side == "right" else [pads, x], 1)
                if side == "left" and s.seq_positions:
                    positions = (is_real.long().cumsum(1) - 1).clamp_min(0)
                    out = s.seq(xp, mask, positions=positions)
                else:
                    out = s.seq(xp, mask)
                out = out[:, :n] if side == "right" else out[:, p:]
                results[f"{side} padding x{p}" + ("" if i == 0 or p != amounts[0] else " (other contents)")] = \
                    max_diff(out, base)
    if not s.seq_positions:
        notes.append("left padding amount not varied: the module takes no positions")
    if probe.note:
        notes.append(probe.note.strip(" ()"))
    return _padding_outcome(results, tolerance(base), notes)


def _padding_fn(subject, options) -> Outcome:
    """A bare attention function: the real rows alone vs padded keys on either side."""
    n = options.seq_len - 2  # real tokens
    notes: list[str] = []
    results: dict[str, float] = {}
    q, k, v = fn_inputs(options, L=n)
    base = subject.fn(q, k, v, None).detach()
    with torch.no_grad():
        for side in ("right", "left"):
            for p in (2, 3):
                pq, pk, pv = fn_inputs(options, L=p, offset=20 + p)
                cat = (lambda a, b: torch.cat([a, b], 2)) if side == "right" else (lambda a, b: torch.cat([b, a], 2))
                real = torch.ones(options.batch, n, dtype=torch.bool)
                fake = torch.zeros(options.batch, p, dtype=torch.bool)
                mask = torch.cat([real, fake] if side == "right" else [fake, real], 1)[:, None, None, :]  # (B,1,1,Lk)
                out = subject.fn(cat(q, pq), cat(k, pk), cat(v, pv), mask)
                out = out[:, :, :n] if side == "right" else out[:, :, p:]
                results[f"{side} padding x{p}"] = max_diff(out, base)
    return _padding_outcome(results, tolerance(base), notes)


@check("padding-leak", "padding leak",
       "Mask padded keys in every layer (key_is_real = attention_mask.bool(), combined with the causal mask), "
       "and give left-padded rows positions that start at their first real token.", order=20)
def padding_leak(subject, options) -> Outcome:
    if subject.lm is not None:
        return _padding_lm(subject, options)
    if subject.seq is not None:
        return _padding_seq(subject, options)
    if subject.fn is not None:
        return _padding_fn(subject, options)
    raise Skip("needs an attention function, a module or a token model")


# --------------------------------------------------------------------------------------------- packing

@check("packing-leak", "packing leak",
       "Packed rows need a document mask (a token attends only within its document, & causal) and positions "
       "that restart at each document.", order=30)
def packing_leak(subject, options) -> Outcome:
    a = options.seq_len // 2 - 1
    b = options.seq_len - a
    doc_ids = torch.tensor([0] * a + [1] * b)  # (L,)
    same_doc = doc_ids[:, None] == doc_ids[None, :]  # (L, L)
    if subject.lm is not None:
        if not subject.lm.supports_doc_ids:
            raise Skip("the model takes no document ids (doc_ids=), so packed rows can't be expressed")
        probe = precise(subject, options)
        s = probe.subject
        dev = model_device(s)
        tokens = tokens_for(s.lm.vocab_size, options.batch, a + b, gen(options, 5), dev)
        positions = torch.cat([torch.arange(a), torch.arange(b)]).to(dev)[None]  # (1, L): restart per document
        with torch.no_grad():
            packed = s.lm.per_position(tokens, positions=positions, doc_ids=doc_ids.to(dev).expand(options.batch, -1))
            alone = torch.cat([s.lm.per_position(tokens[:, :a]), s.lm.per_position(tokens[:, a:])], 1)
    elif subject.seq is not None:
        probe = precise(subject, options)
        s = probe.subject
        x = x_inputs(s, options, a + b, dtype=probe.dtype)
        mask = same_doc.to(x.device)
        with torch.no_grad():
            if s.seq_positions:
                positions = torch.cat([torch.arange(a), torch.arange(b)]).to(x.device)[None]  # (1, L)
                packed = s.seq(x, mask, positions=positions)
            else:
                packed = s.seq(x, mask)
            alone = torch.cat([s.seq(x[:, :a], None), s.seq(x[:, a:], None)], 1)
    elif subject.fn is not None:
        probe = precise(subject, options)
        q, k, v = fn_inputs(options)
        with torch.no_grad():
            packed = subject.fn(q, k, v, same_doc)
            alone = torch.cat([subject.fn(q[:, :, :a], k[:, :, :a], v[:, :, :a], None),
                               subject.fn(q[:, :, a:], k[:, :, a:], v[:, :, a:], None)], 2)
    else:
        raise Skip("needs an attention function, a module or a token model")
    err, tol = max_diff(packed, alone), tolerance(alone)
    details = {"change": err, "tol": tol, "docs": [a, b]}
    if err > tol:
        return Outcome(FAIL, f"packed documents ({a}+{b} tokens) differ from each run alone by {err:.2e} (tol {tol:.0e})"
                       + probe.note, details)
    return Outcome(PASS, f"2 packed documents ({a}+{b} tokens) equal each run alone ({err:.1e}){probe.note}", details)
