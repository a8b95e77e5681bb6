"""NaN propagation and precision at the edges (issue 16 items 6, 7, 11), on every backend.

- item 7: a query holding NaN gives a NaN row on every backend (a zero row hides the bug); a NaN key a row may
  attend makes that row NaN; fully masked rows with finite inputs stay 0 with finite gradients.
- item 6: fully finite float16 inputs with logits beyond float16's range before the scale: finite everywhere.
- item 11: a float bias of large magnitude or with a large constant part costs no more than the docs/conventions.md 2x
  rule allows (SDPA used to cast it to bf16/fp16; the tiled kernel rounded the scores at the offset's magnitude).

Every comparison prints both errors (tests/oracle.py).
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from oracle import assert_within_rule, floor_for, run_with_grads

M = ak.masks
BACKENDS = [b for b in ak.backends.available() if b != "flex"]

NAN_MASKS = {
    "none": lambda L: None,
    "causal": lambda L: M.causal(),
    "window3": lambda L: M.sliding_window(3),
    "padding": lambda L: M.padding([L - 2]),
    "document": lambda L: M.document(torch.tensor([[0] * (L // 2) + [1] * (L - L // 2)])) & M.causal(),
    "bool_tensor": lambda L: torch.ones(L, L, dtype=torch.bool).tril(),
}
NAN_BIASES = {"plain": lambda H, L: None, "alibi": lambda H, L: ak.positions.ALiBi(H),
              "float_bias": lambda H, L: torch.randn(1, H, L, L)}


def _visible(mask, L: int) -> torch.Tensor:
    """(Lq, Lk) bool: which keys each query may attend (default positions)."""
    if mask is None:
        return torch.ones(L, L, dtype=torch.bool)
    if isinstance(mask, torch.Tensor):
        return mask
    return mask.to_dense(L)[0, 0]


@pytest.mark.parametrize(("bias", "dtype"), [("plain", torch.float32), ("plain", torch.bfloat16),
                                             ("alibi", torch.float32), ("float_bias", torch.bfloat16)])
@pytest.mark.parametrize("mask_name", list(NAN_MASKS))
@pytest.mark.parametrize("L", [8, 70])  # SDPA's CPU kernel gave a zero row at 8, NaN at 70; blocksparse cuts at 64
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_query_gives_a_nan_row_on_every_backend(backend, L, mask_name, bias, dtype):
    H, row = 2, L // 2 + 1
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, H, L, 16, generator=g).to(dtype) for _ in range(3))
    q[0, 1, row, 3] = float("nan")
    mask = NAN_MASKS[mask_name](L)
    out = ak.attention(q, k, v, mask, bias=NAN_BIASES[bias](H, L), backend=backend)
    assert torch.isnan(out[0, 1, row]).all(), f"{backend}: the NaN query's row is {out[0, 1, row, :4].tolist()}..."
    others = torch.ones(H, L, dtype=torch.bool)
    others[1, row] = False
    assert torch.isfinite(out[0][others]).all(), f"{backend}: a NaN query reached other rows"


@pytest.mark.parametrize("mask_name", list(NAN_MASKS))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("L", [8, 70])
def test_nan_key_reaches_every_row_that_may_attend_it(backend, L, mask_name):
    H, key = 2, L // 2 - 1
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, H, L, 16, generator=g) for _ in range(3))
    k[0, :, key, 0] = float("nan")
    mask = NAN_MASKS[mask_name](L)
    out = ak.attention(q, k, v, mask, backend=backend)
    sees = _visible(mask, L)[:, key]  # (Lq,) rows that may attend the NaN key
    assert sees.any()
    assert torch.isnan(out[0][:, sees]).all(), f"{backend}: a row that sees the NaN key is not NaN"


def test_nan_query_on_flex():
    """flex's online softmax gave a zero row (CPU inference: compiles once, a few seconds)."""
    if "flex" not in ak.backends.available():
        pytest.skip("this torch has no flex_attention")
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 128, 16, generator=g) for _ in range(3))
    q[0, 0, 5, 0] = float("nan")
    with torch.no_grad():
        out = ak.attention(q, k, v, M.causal() & ~M.sliding_window(2), backend="flex")
        golden = ak.attention(q.double(), k.double(), v.double(), M.causal() & ~M.sliding_window(2), backend="math")
    assert torch.isnan(out[0, 0, 5]).all() and torch.isnan(golden[0, 0, 5]).all()
    assert torch.equal(out[0, 0, :2], torch.zeros_like(out[0, 0, :2]))  # rows that see no key: 0
    fine = torch.ones(2, 128, dtype=torch.bool)
    fine[0, 5] = False
    assert torch.allclose(out[0][fine].double(), golden[0][fine], atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("backend", BACKENDS)
def test_fully_masked_rows_stay_zero_with_finite_grads_next_to_a_nan_free_call(backend, dtype):
    """The NaN rule does not disturb the other convention: a row that sees no key is 0, its gradients finite."""
    q, k, v = (torch.randn(1, 2, 40, 16).to(dtype) for _ in range(3))
    mask = M.causal() & ~M.sliding_window(3)  # rows 0-2 see no key
    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, mask, backend=backend), [q, k, v])
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3])) and torch.isfinite(out).all()
    assert all(torch.isfinite(g).all() for g in grads)


# ---------------------------------------------------------------- item 6: float16 logits beyond 65504


@pytest.mark.parametrize("mask", [None, M.causal(), M.sliding_window(4)], ids=repr)
def test_float16_logits_beyond_the_float16_range_stay_finite_on_math(mask):
    g = torch.Generator().manual_seed(4)
    q, k = ((torch.randn(1, 2, 16, 64, generator=g) * 60).half() for _ in range(2))  # |q k^T| ~ 1e5 > 65504
    v = torch.randn(1, 2, 16, 64, generator=g).half()
    assert float((q.float() @ k.float().transpose(-1, -2)).abs().max()) > torch.finfo(torch.float16).max
    golden = ak.attention(q.double(), k.double(), v.double(), mask, backend="math")
    sdpa = ak.attention(q, k, v, mask, backend="sdpa")
    out, weights = ak.attention(q, k, v, mask, return_weights=True)  # auto: math
    assert torch.isfinite(weights).all()
    assert_within_rule(out, sdpa, golden, what="math vs the SDPA kernel's float16 error")
    assert_within_rule(sdpa, out, golden, what="SDPA vs the reference's float16 error")


# ---------------------------------------------------------------- item 11: precision with a float bias


def _errors(backend, q, k, v, mask, bias):
    """(backend's error, the reference-in-dtype's error) against float64, max abs."""
    golden = ak.reference_attention(q.double(), k.double(), v.double(), mask, bias=bias.double())
    ref_t = ak.reference_attention(q, k, v, mask, bias=bias)
    out = ak.attention(q, k, v, mask, bias=bias, backend=backend)
    return out, ref_t, golden


def _bloom_alibi(H: int, L: int) -> torch.Tensor:
    """BLOOM's ALiBi: slope * key position (equal to -m |i - j| under a causal mask up to a per-row constant),
    a float32 bias of magnitude up to m * L."""
    return ak.positions.alibi_slopes(H).view(1, H, 1, 1) * torch.arange(L, dtype=torch.float32)  # (1, H, 1, L)


LARGE_BIASES = {
    "offset100": lambda H, L, g: torch.randn(1, H, L, L, generator=g) * 3 + 100,
    "offset1000": lambda H, L, g: torch.randn(1, H, L, L, generator=g) * 3 + 1000,
    "bloom_alibi": lambda H, L, g: _bloom_alibi(H, L).expand(1, H, L, L),
}


@pytest.mark.parametrize("bias_name", list(LARGE_BIASES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_sdpa_keeps_a_large_float_bias_in_float32(dtype, bias_name):
    H, L = 4, 384
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, H, L, 64, generator=g).to(dtype) for _ in range(3))
    bias = LARGE_BIASES[bias_name](H, L, g)
    out, ref_t, golden = _errors("sdpa", q, k, v, M.causal(), bias)
    assert_within_rule(out, ref_t, golden, what=f"sdpa {dtype} with bias {bias_name}")


@pytest.mark.parametrize("mask", [None, M.causal(), M.sliding_window(100)], ids=repr)
@pytest.mark.parametrize("offset", [1e3, 1e4])
def test_tiled_kernel_ignores_a_constant_offset_in_the_bias(offset, mask):
    """softmax ignores a constant added to a row: so must the error. The blocksparse (tiled) result with
    ``bias + offset`` stays within 2x of the float32 reference's error *without* the offset."""
    H, L = 4, 300
    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, H, L, 64, generator=g) for _ in range(3))
    bias = torch.randn(1, H, L, L, generator=g)
    out, ref_t, golden = _errors("blocksparse", q, k, v, mask, bias + offset)
    _, ref_plain, golden_plain = _errors("blocksparse", q, k, v, mask, bias)
    assert_within_rule(out, ref_t, golden, what=f"blocksparse with bias + {offset:g}")
    err, ref_err = float((out.double() - golden).abs().max()), float((ref_plain.double() - golden_plain).abs().max())
    floor = floor_for(torch.float32, golden)
    assert err <= 2 * ref_err + floor, (f"bias + {offset:g}: blocksparse error {err:.3e} exceeds 2 x the float32 "
                                        f"reference's error without the offset {ref_err:.3e} + floor {floor:.3e}")


class _OffsetALiBi(ak.positions.ALiBi):
    """ALiBi plus a large constant (softmax ignores it): a relative bias served from the offset table."""

    def score(self, h, q_pos, kv_pos, b=None):
        return super().score(h, q_pos, kv_pos, b=b) + 1e4

    def reach(self, margin):
        return None  # not 0 at offset 0: no pruning


def test_offset_table_ignores_a_constant_part_of_a_relative_bias():
    H, L = 4, 300
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, H, L, 64, generator=g) for _ in range(3))
    out = ak.attention(q, k, v, M.causal(), bias=_OffsetALiBi(H), backend="blocksparse")
    golden = ak.reference_attention(q.double(), k.double(), v.double(), M.causal(), bias=ak.positions.ALiBi(H))
    ref_plain = ak.reference_attention(q, k, v, M.causal(), bias=ak.positions.ALiBi(H))
    assert_within_rule(out, ref_plain, golden, what="offset table with ALiBi + 1e4 vs the reference without it")
