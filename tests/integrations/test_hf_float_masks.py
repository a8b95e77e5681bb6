"""A 4-D float mask built with -inf (not transformers' finfo.min) through attn_implementation="attnkit": rows that
see no key (a left-padded query) give 0, never NaN, in the logits and the gradients (issue 33 item 2: Gemma-2's
softcap sends its calls to the ``eager`` backend, which returned NaN rows there)."""

from __future__ import annotations

import torch
from hf_tiny import VOCAB, build

TOL = 1e-5


def _float_mask(am: torch.Tensor, fill: float) -> torch.Tensor:
    """``(B, 1, L, L)`` additive causal + padding mask: 0 where a query may attend, ``fill`` elsewhere."""
    L = am.shape[1]
    allowed = torch.ones(L, L, dtype=torch.bool).tril()[None, None] & am.bool()[:, None, None, :]  # (B, 1, L, L)
    return torch.zeros(allowed.shape).masked_fill(~allowed, fill)


def test_gemma2_with_an_inf_float_mask_gives_finite_logits_and_gradients():
    torch.manual_seed(0)
    ref = build("gemma2", "eager")
    model = build("gemma2", "attnkit")
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(3, VOCAB, (2, 11))
    am = torch.ones(2, 11, dtype=torch.long)
    am[1, :4] = 0  # left padding: row 1's first query sees no key at all
    inf_mask = _float_mask(am, float("-inf"))
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=inf_mask).logits
        want = ref(input_ids=ids, attention_mask=_float_mask(am, torch.finfo(torch.float32).min)).logits
    assert torch.isfinite(got).all(), "NaN logits with a -inf float mask"
    real = am.bool()
    err = (got[real] - want[real]).abs().max().item()
    assert err <= TOL, f"real rows: attnkit with -inf vs eager with finfo.min {err:.3g}"
    model.train()
    model.config.attention_dropout = 0.0
    model(input_ids=ids, attention_mask=inf_mask, labels=ids.masked_fill(~real, -100)).loss.backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients: {bad}"
