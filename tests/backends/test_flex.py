"""flex: its mask_mod and score_mod are checked on flex's eager path (fast, any device); one small compiled
call runs where flex is available (CPU: inference only, compiles for seconds)."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit._validation import build_call
from attnkit.backends.flex import FlexBackend, block_mask_for, score_mod_for

M = ak.masks
pytestmark = [pytest.mark.skipif(FlexBackend().available() != [], reason="this torch has no flex_attention"),
              pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")]


def _qkv(B=2, H=4, Hkv=2, L=80, D=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, Hkv, L, D, generator=g),
            torch.randn(B, Hkv, L, D, generator=g))


@pytest.mark.parametrize("mask, kwargs", [
    (M.sliding_window(9) | M.global_tokens([0]), {}),
    (M.document(torch.arange(80)[None].expand(2, -1) // 17) & M.causal(), {"bias": "alibi"}),
    (M.causal() & M.strided(3), {"softcap": 2.0}),
    (M.padding(torch.tensor([5, 80])), {"kv_positions": torch.arange(80) + 9, "q_positions": torch.arange(80) + 9}),
    (M.causal() & ~M.sliding_window(2), {}),  # empty rows stay 0
])
def test_mods_match_reference_on_eager_flex(mask, kwargs):
    from torch.nn.attention.flex_attention import flex_attention

    q, k, v = _qkv()
    if kwargs.get("bias") == "alibi":
        kwargs = {**kwargs, "bias": ak.positions.ALiBi(4)}
    call = build_call(q, k, v, mask, **kwargs)
    out = flex_attention(q, k, v, score_mod=score_mod_for(call), block_mask=block_mask_for(call),
                         scale=call.scale, enable_gqa=True)  # eager: unfused, but the same mods
    ref = ak.reference_attention(q, k, v, mask, **kwargs)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_block_mask_is_built_once_per_prepared_mask():
    """Shared by the layers of a forward (one prepared mask); never kept across calls (issue 16 item 2)."""
    q, k, v = _qkv()
    mask = M.sliding_window(9)
    prepared = M.prepare(mask, q.shape[2])
    call = build_call(q, k, v, prepared)
    assert block_mask_for(call) is block_mask_for(build_call(q, k, v, prepared))
    assert block_mask_for(build_call(q, k, v, mask)) is not block_mask_for(build_call(q, k, v, mask))


def test_compiled_flex_inference_matches_reference():
    """One compiled call (CPU: seconds to compile, inference only; CUDA: forward and backward)."""
    q, k, v = _qkv(B=1, H=2, Hkv=1, L=128, D=16)
    mask = M.sliding_window(16)
    with torch.no_grad():
        out = ak.attention(q, k, v, mask, backend="flex", bias=ak.positions.ALiBi(2))
    ref = ak.reference_attention(q, k, v, mask, bias=ak.positions.ALiBi(2))
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
