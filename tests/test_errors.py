"""Every raise of the front door: typed, naming the argument, its value and the fix."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.errors import AttnkitTypeError, AttnkitValueError, BackendUnsupportedError

q4 = torch.randn(2, 4, 5, 8)
k2 = torch.randn(2, 2, 5, 8)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"q": [1.0]}, AttnkitTypeError, "q must be a torch.Tensor"),
        ({"q": torch.randn(4, 5, 8)}, AttnkitValueError, r"q must have 4 dims \(B, H, Lq, D\)"),
        ({"k": torch.randn(2, 2, 5, 8).long()}, AttnkitTypeError, "k must be a floating-point tensor"),
        ({"v": torch.randn(2, 2, 5, 8).double()}, AttnkitTypeError, "q, k, v must share one dtype"),
        ({"k": torch.randn(3, 2, 5, 8), "v": torch.randn(3, 2, 5, 8)}, AttnkitValueError, "batch sizes differ"),
        ({"v": torch.randn(2, 2, 6, 8)}, AttnkitValueError, r"must agree on \(Hkv, Lk\)"),
        ({"k": torch.randn(2, 2, 5, 7)}, AttnkitValueError, "k head dim 7 differs from q head dim 8"),
        ({"k": torch.randn(2, 3, 5, 8), "v": torch.randn(2, 3, 5, 8)}, AttnkitValueError,
         "H=4 must be a multiple of num_kv_heads Hkv=3"),
        ({"mask": torch.ones(5, 5)}, AttnkitTypeError, "mask must be boolean .* pass additive float masks as bias="),
        ({"mask": "causal"}, AttnkitTypeError, "mask must be an attnkit mask"),
        ({"mask": torch.ones(3, 5, 5, dtype=torch.bool)}, AttnkitValueError, r"mask of shape \(3, 5, 5\) does not broadcast"),
        ({"bias": torch.ones(5, 5, dtype=torch.bool)}, AttnkitTypeError, "bias must be a float tensor"),
        ({"bias": torch.ones(1, 1, 1, 5, 5)}, AttnkitValueError, "bias of shape .* does not broadcast"),
        ({"scale": 0.0}, AttnkitValueError, r"scale must be > 0.0, got 0.0"),
        ({"scale": "x"}, AttnkitTypeError, "scale must be a finite number"),
        ({"softcap": -1.0}, AttnkitValueError, "softcap must be > 0.0, got -1.0"),
        ({"dropout_p": 1.0}, AttnkitValueError, r"dropout_p must be in \[0.0, 1.0\), got 1.0"),
        ({"q_positions": torch.arange(4)}, AttnkitValueError, r"q_positions must have shape \(5,\) or \(2, 5\)"),
        ({"kv_positions": torch.arange(5.0)}, AttnkitTypeError, "kv_positions must be an integer tensor"),
        ({"backend": "flash9"}, AttnkitValueError, "unknown backend 'flash9'"),
        ({"bias": None, "softcap": 3.0, "backend": "sdpa"}, BackendUnsupportedError,
         "backend 'sdpa' can't serve this call: SDPA has no logit softcap"),
        ({"return_weights": True, "backend": "sdpa"}, BackendUnsupportedError, "does not return attention weights"),
    ],
)
def test_attention_argument_errors(kwargs, error, match):
    args = {"q": q4, "k": k2, "v": k2.clone()}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        ak.attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_alibi_with_wrong_head_count():
    with pytest.raises(AttnkitValueError, match="built for 2 heads but q has 4"):
        ak.attention(q4, k2, k2, bias=ak.positions.ALiBi(2))


def test_device_mismatch_is_reported():
    meta = torch.empty(2, 2, 5, 8, device="meta")
    with pytest.raises(AttnkitValueError, match="must be on one device"):
        ak.attention(q4, meta, meta)
    with pytest.raises(AttnkitValueError, match="q_positions is on meta but q is on cpu"):
        ak.attention(q4, k2, k2, q_positions=torch.arange(5, device="meta"))


def test_errors_are_builtin_types():
    assert issubclass(AttnkitValueError, ValueError) and issubclass(AttnkitTypeError, TypeError)
    assert issubclass(BackendUnsupportedError, NotImplementedError)


def test_unsupported_error_carries_reasons():
    with pytest.raises(BackendUnsupportedError) as info:
        ak.attention(q4, k2, k2, softcap=2.0, return_weights=True, backend="sdpa")
    assert len(info.value.reasons) == 2


def test_explain_names_choice_and_reasons():
    text = str(ak.explain(q4, k2, k2, ak.masks.sliding_window(3)))
    assert text.startswith("backend: sdpa - dense mask tensor")
    forced = ak.explain(q4, k2, k2, softcap=2.0, backend="sdpa")
    assert forced.plan.startswith("can't serve this call: SDPA has no logit softcap")
    why = ak.explain(q4, k2, k2, ak.masks.causal(), q_positions=torch.arange(5), kv_positions=torch.arange(5))
    assert "can't use SDPA's top-left is_causal" in why.plan
