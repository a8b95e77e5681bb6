"""The ``eager`` backend's place in routing: ``auto`` sends short softcap calls (a Gemma-2 decode step or short
prompt) to it and nothing else; its outputs and gradients are checked on the oracle grid with every backend
(tests/backends/test_oracle.py), here the decode step it was built for, against the float64 reference."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.backends.eager import EAGER_MAX_ENTRIES
from attnkit.functional.reference import reference_attention
from oracle import assert_within_rule

M = ak.masks


@pytest.mark.parametrize("q_len, kv_len, mask", [(1, 40, M.causal()), (1, 2048, M.causal()), (16, 16, M.causal()),
                                                  (5, 77, M.sliding_window(9)), (128, 128, None)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_sends_short_softcap_calls_to_eager(q_len, kv_len, mask, dtype):
    q = torch.randn(2, 8, q_len, 32, dtype=dtype) * 4
    k, v = torch.randn(2, 2, 4, kv_len, 32, dtype=dtype).unbind(0)
    assert ak.explain(q, k, v, mask, softcap=20.0).chosen == "eager"
    out = ak.attention(q, k, v, mask, softcap=20.0)
    golden = reference_attention(q.double(), k.double(), v.double(), mask, softcap=20.0)
    assert_within_rule(out, reference_attention(q, k, v, mask, softcap=20.0), golden)


def test_eager_is_not_chosen_past_its_size_or_without_a_softcap():
    side = int(EAGER_MAX_ENTRIES ** 0.5) * 2  # Lq x Lk = 4 x the bound
    q = torch.randn(1, 4, side, 16)
    assert ak.explain(q, q, q, M.causal(), softcap=20.0).chosen != "eager"
    small = q[:, :, :8]
    assert ak.explain(small, small, small, M.causal()).chosen == "sdpa"
    with pytest.raises(ak.errors.BackendUnsupportedError, match="eager does not return attention weights"):
        ak.attention(small, small, small, softcap=20.0, backend="eager", return_weights=True)
