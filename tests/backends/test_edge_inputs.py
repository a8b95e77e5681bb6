"""Edge inputs at the front door (issue 16 items 4, 8, 10, 20, 22): each is refused with a typed error naming
the argument, or served correctly on every backend — never a silent wrong answer or a crash.

flex runs here only where it can (CUDA, or CPU inference with compiling allowed); the other backends always.
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError

M = ak.masks
BACKENDS = [b for b in ak.backends.available() if b != "flex"]


# ---------------------------------------------------------------- item 4: causal with Lq > Lk, default positions
# (issue 21 item 11 reverses the refusal: bottom-right alignment as flash-attn and PyTorch's causal_lower_right;
# the oracle grid is tests/backends/test_oracle.py::test_more_queries_than_keys)


@pytest.mark.parametrize("backend", ["auto", *BACKENDS])
@pytest.mark.parametrize("mask", [M.causal(), M.sliding_window(2), M.padding([2]) & M.causal(),
                                  M.global_tokens([0]) | M.strided(2)], ids=repr)
def test_positional_mask_with_more_queries_than_keys_aligns_bottom_right(mask, backend):
    """Default positions put the 5 queries at -2..2: the call equals the same call with those positions
    given, and the picture draws the rows the call computes."""
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    pos = {"q_positions": torch.arange(-2, 3), "kv_positions": torch.arange(3)}
    torch.testing.assert_close(ak.attention(q, k, v, mask, backend=backend),
                               ak.attention(q, k, v, mask, backend="math", **pos))
    assert torch.equal(mask.to_dense(5, 3), mask.to_dense(pos["q_positions"], pos["kv_positions"]))


def test_causal_picture_with_more_queries_than_keys_has_empty_top_rows():
    assert M.causal().picture(4, 2).splitlines() == [". .", ". .", "# .", "# #"]


def test_structured_bias_with_more_queries_than_keys_is_served():
    q, k = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 3, 8)
    pos = {"q_positions": torch.arange(-2, 3), "kv_positions": torch.arange(3)}
    torch.testing.assert_close(ak.attention(q, k, k, bias=ak.positions.ALiBi(2)),
                               ak.attention(q, k, k, bias=ak.positions.ALiBi(2), backend="math", **pos))


@pytest.mark.parametrize("backend", BACKENDS)
def test_more_queries_than_keys_still_serves_what_is_well_defined(backend):
    """Index-based masks (cross-attention with key padding) and explicit positions need no default alignment."""
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8)
    golden = ak.attention(q.double(), k.double(), v.double(), M.padding([2]), backend="math")
    out = ak.attention(q, k, v, M.padding([2]), backend=backend)
    torch.testing.assert_close(out.double(), golden, atol=1e-5, rtol=1e-5)
    pos = {"q_positions": torch.arange(5), "kv_positions": torch.arange(3)}
    golden = ak.attention(q.double(), k.double(), v.double(), M.causal(), backend="math", **pos)
    torch.testing.assert_close(ak.attention(q, k, v, M.causal(), backend=backend, **pos).double(), golden,
                               atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- item 8: dense mask for the wrong heads


@pytest.mark.parametrize("backend", ["auto", *ak.backends.available()])
@pytest.mark.parametrize("wrap", [lambda t: M.dense(t), lambda t: M.causal() & M.dense(t)], ids=["dense", "and"])
def test_dense_mask_for_the_wrong_number_of_heads_is_a_typed_error(backend, wrap):
    q = torch.randn(1, 4, 4, 8)
    mask = wrap(torch.ones(1, 3, 4, 4, dtype=torch.bool))
    with torch.no_grad(), pytest.raises(AttnkitValueError, match=r"dense\(1, 3, 4, 4\)\)? holds data for batch 1 and 3 "
                                                                  r"heads.*\(B, H, Lq, Lk\)=\(1, 4, 4, 4\)"):
        ak.attention(q, q, q, mask, backend=backend)


def test_mask_data_for_the_wrong_batch_is_a_typed_error_at_validation():
    q = torch.randn(3, 2, 4, 8)
    with pytest.raises(AttnkitValueError, match=r"padding\(lengths=\[1, 2\]\) holds data for batch 2.*B=3"):
        ak.explain(q, q, q, M.padding([1, 2]))


# ---------------------------------------------------------------- item 10: small coercions


@pytest.mark.parametrize("positions", [[1.5], torch.tensor([2.0]), [True]])
def test_global_tokens_refuses_non_integer_positions(positions):
    with pytest.raises(AttnkitTypeError, match="global_tokens positions must be ints"):
        M.global_tokens(positions)


@pytest.mark.parametrize("value", ["no", 1, None])
def test_return_weights_must_be_a_bool(value):
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(AttnkitTypeError, match=f"return_weights must be True or False, got {value!r}"):
        ak.attention(q, q, q, return_weights=value)


# ---------------------------------------------------------------- item 22: global tokens far away


def _largest_allocation(fn) -> int:
    """The largest single CPU allocation (bytes) made while ``fn`` runs, from the profiler."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events() if e.cpu_memory_usage > 0), default=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_global_tokens_memory_does_not_grow_with_the_largest_position(backend):
    q = torch.randn(1, 1, 16, 8)
    mask = M.global_tokens([0, 10**8]) | M.sliding_window(2)  # main allocated a 100 MB table for this
    golden = ak.attention(q.double(), q.double(), q.double(), M.global_tokens([0]) | M.sliding_window(2),
                          backend="math")
    out = ak.attention(q, q, q, mask, backend=backend)
    torch.testing.assert_close(out.double(), golden, atol=1e-5, rtol=1e-5)
    biggest = _largest_allocation(lambda: ak.attention(q, q, q, mask, backend=backend))
    assert biggest < 1 << 20, f"largest allocation {biggest} bytes for a 16-token call"
    far = M.global_tokens([10**11])  # a 100 GB table on main
    assert ak.attention(q, q, q, far & M.causal(), backend=backend).shape == (1, 1, 16, 8)


# ---------------------------------------------------------------- item 20: empty calls


EMPTY_SHAPES = {"Lq=0": (2, 4, 2, 0, 5), "Lk=0": (2, 4, 2, 3, 0), "B=0": (0, 4, 2, 3, 5)}  # (B, H, Hkv, Lq, Lk)
EMPTY_OPTIONS = {
    "none": lambda B, Lk: {},
    "causal": lambda B, Lk: {"mask": M.causal()},
    "window_alibi": lambda B, Lk: {"mask": M.sliding_window(2), "bias": ak.positions.ALiBi(4)},
    "padding": lambda B, Lk: {"mask": M.padding([Lk] * B) if B else M.padding(torch.zeros(0, dtype=torch.long))},
    "float_bias": lambda B, Lk: {"bias": torch.randn(1, 4, 1, Lk)},
}


@pytest.mark.parametrize("backend", ["auto", *ak.backends.available()])
@pytest.mark.parametrize("option", list(EMPTY_OPTIONS))
@pytest.mark.parametrize("shape", list(EMPTY_SHAPES))
def test_empty_calls_give_zeros_of_the_right_shape_forward_and_backward(shape, option, backend):
    B, H, Hkv, Lq, Lk = EMPTY_SHAPES[shape]
    kw = EMPTY_OPTIONS[option](B, Lk)
    q, k, v = torch.randn(B, H, Lq, 8), torch.randn(B, Hkv, Lk, 8), torch.randn(B, Hkv, Lk, 6)
    if backend == "flex" and isinstance(kw.get("bias"), torch.Tensor):  # a forced backend still refuses
        with torch.no_grad(), pytest.raises(BackendUnsupportedError, match="flex serves structured biases"):
            ak.attention(q, k, v, backend=backend, **kw)
        return
    grads = backend != "flex"  # flex has no backward on CPU: its forward only (it was a SIGFPE)
    leaves = [t.clone().requires_grad_(grads) for t in (q, k, v)]
    with torch.set_grad_enabled(grads):
        out = ak.attention(*leaves, backend=backend, **kw)
    assert out.shape == (B, H, Lq, 6) and torch.equal(out, torch.zeros_like(out))
    if grads:
        out.sum().backward()
        for leaf in leaves:
            assert leaf.grad is not None and leaf.grad.shape == leaf.shape and not leaf.grad.any()


@pytest.mark.parametrize("shape", list(EMPTY_SHAPES))
def test_empty_calls_return_empty_weights(shape):
    B, H, Hkv, Lq, Lk = EMPTY_SHAPES[shape]
    q, k = torch.randn(B, H, Lq, 8), torch.randn(B, Hkv, Lk, 8)
    out, weights = ak.attention(q, k, k, M.causal(), return_weights=True)
    assert out.shape == (B, H, Lq, 8) and weights.shape == (B, H, Lq, Lk)
    out, weights = ak.reference_attention(q, k, k, return_weights=True)
    assert out.shape == (B, H, Lq, 8) and weights.shape == (B, H, Lq, Lk)


def test_explicit_empty_positions_and_to_dense():
    q, k = torch.randn(1, 2, 0, 8), torch.randn(1, 2, 4, 8)
    out = ak.attention(q, k, k, M.causal(), q_positions=torch.zeros(1, 0, dtype=torch.long))
    assert out.shape == (1, 2, 0, 8)
    assert M.causal().to_dense(torch.zeros(0, dtype=torch.long), torch.arange(4)).shape == (1, 1, 0, 4)


def test_zero_head_dim_is_a_typed_error():
    q = torch.randn(1, 2, 3, 0)
    with pytest.raises(AttnkitValueError, match="head dim D=0"):
        ak.attention(q, q, q)
