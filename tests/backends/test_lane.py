"""The plain lane (backends/lane.py): a plain call like an earlier one skips validation and routing.

Each test checks that the lane served (a spy counts the full-path builds), that it equals the full path bitwise and
the float64 reference by the oracle rule, and that it never serves what its key does not fix: another shape,
dtype, grad mode, mask, registry, or a call that is not plain. Not timed (speed lives in ``attnkit bench dispatch``).
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit import _validation
from attnkit.backends import lane, registry
from attnkit.backends.base import Rank
from attnkit.errors import AttnkitValueError
from attnkit.functional.reference import reference_attention
from oracle import assert_within_rule

M = ak.masks


@pytest.fixture
def builds(monkeypatch):
    """The lane keys built through the full path (a second call of a key must not add one)."""
    seen = []
    real = lane._lane

    def spy(q, k, v, mask):
        seen.append((q.shape, k.shape, q.dtype))
        return real(q, k, v, mask)

    monkeypatch.setattr(lane, "_lane", spy)
    lane._LANES.clear()
    return seen


def _full_path(q, k, v, mask):
    call = _validation.build_call(q, k, v, mask)
    return registry.select(call)(call)


CASES = {  # name: (B, H, Hkv, Lq, Lk, mask builder)
    "none": (2, 4, 4, 9, 9, lambda: None),
    "causal": (2, 4, 2, 9, 9, lambda: M.causal()),
    "decode_gqa": (3, 8, 2, 1, 40, lambda: M.causal()),
    "chunk_mqa": (1, 4, 1, 5, 40, lambda: M.causal()),
    "prepared_padding": (2, 4, 4, 12, 12, lambda: M.prepare(M.causal() & M.padding(torch.tensor([7, 12])), 12)),
    "prepared_window_batch1": (3, 4, 2, 16, 16, lambda: M.prepare(M.sliding_window(5), 16)),
    "prepared_decode": (2, 4, 4, 3, 20, lambda: M.prepare(M.causal(), 3, 20)),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", list(CASES))
def test_the_lane_equals_the_full_path_and_the_reference(builds, case, dtype):
    B, H, Hkv, Lq, Lk, make = CASES[case]
    q = torch.randn(B, H, Lq, 24, dtype=dtype)
    k, v = torch.randn(2, B, Hkv, Lk, 24, dtype=dtype).unbind(0)
    mask = make()
    first = ak.attention(q, k, v, mask)
    q2, k2, v2 = torch.randn_like(q), torch.randn_like(k), torch.randn_like(v)  # same key, other values
    mask2 = make() if not isinstance(mask, M.PreparedMask) else mask  # a fresh causal(), or the same prepared mask
    served = ak.attention(q2, k2, v2, mask2)
    assert len(builds) == 1, f"the second call of one key took the full path ({len(builds)} builds)"
    assert torch.equal(first, _full_path(q, k, v, mask))
    assert torch.equal(served, _full_path(q2, k2, v2, mask2)), "the lane differs from the full path"
    spec = mask.source if isinstance(mask, M.PreparedMask) else mask
    golden = reference_attention(q2.double(), k2.double(), v2.double(), spec)
    assert_within_rule(served, reference_attention(q2, k2, v2, spec), golden)


def test_the_key_fixes_shapes_dtypes_and_grad_mode(builds):
    q = torch.randn(1, 2, 6, 8)
    ak.attention(q, q, q, M.causal())
    ak.attention(q[:, :, :5], q, q, M.causal())  # another Lq
    ak.attention(q.double(), q.double(), q.double(), M.causal())  # another dtype
    ak.attention(q, q, q)  # no mask: another kind
    assert len(builds) == 4
    leaf = q.clone().requires_grad_(True)
    out = ak.attention(leaf, q, q, M.causal())  # autograd records now: another key, and gradients flow
    assert len(builds) == 5 and out.requires_grad
    out.sum().backward()
    golden = torch.autograd.grad(reference_attention(leaf.double(), q.double(), q.double(), M.causal()).sum(), leaf)[0]
    assert torch.allclose(leaf.grad, golden, atol=1e-5)
    with torch.no_grad():
        assert not ak.attention(leaf, q, q, M.causal()).requires_grad
    assert len(builds) == 6


class _First:
    """A backend that ranks first for every call and counts the calls it served."""

    name = "first"
    ranks_by_signature = True

    def __init__(self):
        self.served = 0

    def available(self):
        return []

    def supports(self, call):
        return []

    def rank(self, call):
        return Rank(1000, "test backend")

    def plan(self, call):
        return "test"

    def __call__(self, call):
        self.served += 1
        return registry.get("math")(call)


def test_registering_a_backend_reroutes_lanes(builds):
    q = torch.randn(1, 2, 4, 8)
    ak.attention(q, q, q, M.causal())
    first = _First()
    registry.register(first)
    try:
        ak.attention(q, q, q, M.causal())
        assert first.served == 1, "a lane kept serving the old routing after register()"
    finally:
        registry.unregister("first")
    ak.attention(q, q, q, M.causal())
    assert first.served == 1


def test_a_backend_that_does_not_rank_by_signature_is_asked_per_call_and_keeps_the_lane(builds):
    class Moody(_First):
        name = "moody"
        ranks_by_signature = False

        def __init__(self):
            super().__init__()
            self.asked = 0

        def rank(self, call):  # depends on something outside the call: asked every time
            self.asked += 1
            return Rank(1000 if self.asked % 2 else -1000, "changes its mind")

    moody = Moody()
    registry.register(moody)
    try:
        q = torch.randn(1, 2, 4, 8)
        outs = [ak.attention(q, q, q, M.causal()) for _ in range(4)]
        assert len(builds) == 1, "a backend without ranks_by_signature turned the lane off"
        assert moody.asked == 4 and moody.served == 2, (moody.asked, moody.served)  # asked once per call
        golden = reference_attention(q.double(), q.double(), q.double(), M.causal())
        for out in outs:
            assert_within_rule(out, reference_attention(q, q, q, M.causal()), golden)
    finally:
        registry.unregister("moody")


@pytest.mark.parametrize("kwargs", [dict(bias=torch.zeros(4, 4)), dict(softcap=5.0), dict(return_weights=True),
                                    dict(q_positions=torch.arange(4)), dict(dropout_p=0), dict(backend="math"),
                                    dict(scale=1)])
def test_calls_that_are_not_plain_take_the_full_path(builds, kwargs):
    q = torch.randn(1, 2, 4, 8)
    ak.attention(q, q, q, M.causal(), **kwargs)
    assert builds == []


def test_a_tensor_subclass_and_other_masks_take_the_full_path(builds):
    q = torch.randn(1, 2, 4, 8)
    ak.attention(torch.nn.Parameter(q), q, q)
    ak.attention(q, q, q, M.sliding_window(2))  # an unprepared mask with data or parameters
    ak.attention(q, q, q, torch.ones(4, 4, dtype=torch.bool))
    assert builds == []


def test_checks_still_fire_after_a_lane_exists(builds):
    q = torch.randn(1, 2, 6, 8)
    prepared = M.prepare(M.causal(), 6)
    ak.attention(q, q, q, prepared)
    with pytest.raises(AttnkitValueError, match="mask was prepared for batch 1, Lq=6, Lk=6"):
        ak.attention(q[:, :, :5], q, q, prepared)
    with pytest.raises(AttnkitValueError, match="scale must be"):
        ak.attention(q, q, q, prepared, scale=-1.0)
    with pytest.raises(AttnkitValueError, match="batch sizes differ"):
        ak.attention(q, torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8), M.causal())


def test_each_prepared_mask_has_its_own_lanes(builds):
    q = torch.randn(2, 2, 6, 8)
    for lengths in ([3, 6], [6, 2]):
        spec = M.padding(torch.tensor(lengths))
        out = ak.attention(q, q, q, M.prepare(spec, 6))
        golden = reference_attention(q.double(), q.double(), q.double(), spec)
        assert_within_rule(out, reference_attention(q, q, q, spec), golden)
    assert len(builds) == 2


def test_empty_calls_and_the_bound(builds, monkeypatch):
    q = torch.randn(1, 2, 0, 8)
    k = torch.randn(1, 2, 5, 8)
    for _ in range(2):
        assert ak.attention(q, k, k, M.causal()).shape == (1, 2, 0, 8)
    assert len(builds) == 1
    monkeypatch.setattr(lane._LANES, "max_entries", 3)
    for L in range(1, 8):
        x = torch.randn(1, 1, L, 4)
        ak.attention(x, x, x)
        assert len(lane._LANES) <= 3
