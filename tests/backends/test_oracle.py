"""Every backend against the float64 reference (DESIGN.md 2x/3x rule), outputs and gradients.

A backend that can't serve a case must refuse it with reasons when forced; it may never return a wrong answer.
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit._validation import build_call
from attnkit.errors import BackendUnsupportedError
from oracle import assert_within_rule, run_with_grads

# (B, H, Hkv, Lq, Lk, D): MHA/GQA/MQA, odd head dim, lengths at block edges, Lq != Lk, a decode step
SHAPES = [
    (2, 4, 4, 7, 7, 16),
    (1, 4, 2, 65, 65, 59),
    (2, 4, 1, 63, 129, 32),
    (1, 4, 2, 1, 127, 64),
    (1, 2, 2, 129, 129, 8),
]
SHAPE_IDS = ["mha-7", "gqa-65-d59", "mqa-63x129", "decode-1x127", "mha-129-d8"]


def _lengths(B, Lk, g):
    return torch.randint(1, Lk + 1, (B,), generator=g)


def _left_padded(B, Lk, g):
    pads = torch.randint(0, Lk, (B,), generator=g)
    return torch.arange(Lk)[None, :] >= pads[:, None]  # (B, Lk), True = real


def _docs(B, Lk, g):
    starts = torch.rand(B, Lk, generator=g) < 0.15
    return starts.long().cumsum(-1)  # (B, Lk) non-decreasing document ids


def _random_bool(B, Lq, Lk, g):
    m = torch.rand(B, 1, Lq, Lk, generator=g) < 0.6
    m[:, :, ::5] = False  # every fifth row fully masked
    return m


M = ak.masks
MASKS = {
    "none": lambda B, Lq, Lk, g: None,
    "causal": lambda B, Lq, Lk, g: M.causal(),
    "window5": lambda B, Lq, Lk, g: M.sliding_window(5),
    "pad_lengths": lambda B, Lq, Lk, g: M.padding(_lengths(B, Lk, g)),
    "pad_left_causal": lambda B, Lq, Lk, g: M.padding(_left_padded(B, Lk, g)) & M.causal(),
    "document_causal": lambda B, Lq, Lk, g: M.document(_docs(B, Lk, g)) & M.causal(),
    "strided_causal": lambda B, Lq, Lk, g: M.causal() & M.strided(3),
    "global_window": lambda B, Lq, Lk, g: (M.sliding_window(4) | M.global_tokens([0, 2])) & M.causal(),
    "empty_rows": lambda B, Lq, Lk, g: M.causal() & ~M.sliding_window(2),  # the first rows see nothing
    "bool_tensor": _random_bool,
}

EXTRAS = {
    "plain": lambda B, H, Lq, Lk, g: {},
    "alibi": lambda B, H, Lq, Lk, g: {"bias": ak.positions.ALiBi(H)},
    "float_bias": lambda B, H, Lq, Lk, g: {"bias": torch.randn(1, H, Lq, Lk, generator=g)},
    "softcap": lambda B, H, Lq, Lk, g: {"softcap": 2.0, "scale": 1.0},
    "positions": lambda B, H, Lq, Lk, g: {"kv_positions": torch.arange(Lk) + 100,
                                          "q_positions": torch.arange(Lk - Lq, Lk) + 100},
}

BACKENDS = ak.backends.available()
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _to(kwargs, dtype):
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kwargs.items()}


def check_backend(backend, dtype, shape, mask_name, extra_name, seed=0):
    B, H, Hkv, Lq, Lk, D = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, Lk, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, Lk, D, generator=g).to(dtype)
    mask = MASKS[mask_name](B, Lq, Lk, g)
    kwargs = EXTRAS[extra_name](B, H, Lq, Lk, g)

    reasons = ak.backends.get(backend).supports(build_call(q, k, v, mask, **kwargs))
    if reasons:
        with pytest.raises(BackendUnsupportedError, match="can't serve this call"):
            ak.attention(q, k, v, mask, backend=backend, **kwargs)
        return

    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, mask, backend=backend, **kwargs), [q, k, v])
    ref, ref_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kwargs), [q, k, v])
    gold, gold_grads = run_with_grads(
        lambda q, k, v: ak.reference_attention(q, k, v, mask, **_to(kwargs, torch.float64)),
        [q.double(), k.double(), v.double()],
    )
    assert out.dtype == dtype
    assert_within_rule(out, ref, gold, what=f"{backend} output")
    for name, got, r, gg in zip("qkv", grads, ref_grads, gold_grads):
        assert_within_rule(got, r, gg, factor=3.0, what=f"{backend} grad {name}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_masks_against_reference(backend, dtype, shape, mask_name):
    check_backend(backend, dtype, shape, mask_name, "plain")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("mask_name", ["none", "causal", "window5", "document_causal"])
@pytest.mark.parametrize("extra_name", [e for e in EXTRAS if e != "plain"])
def test_options_against_reference(backend, dtype, shape, mask_name, extra_name):
    check_backend(backend, dtype, shape, mask_name, extra_name)

