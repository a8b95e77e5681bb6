"""Routing by predicted cost (backends/cost.py): auto takes the cheapest predicted capable backend.

Every decision here is checked under a pinned fake calibration (never the clock): the coefficients are chosen so
the expected choice follows from the work each backend reports, and the same call flips when the coefficients do.
"""

from __future__ import annotations

import json

import pytest
import torch

import attnkit as ak
from attnkit import _validation
from attnkit.backends import cost, registry
from attnkit.backends.base import Rank
from attnkit.bench import tune

M = ak.masks


def table(**per_backend):
    """A calibration giving each backend the same coefficients for every dtype and direction."""
    out = {}
    for name, coefficients in per_backend.items():
        for dtype in ("float32", "bfloat16", "float64"):
            for direction in cost.DIRECTIONS:
                out[f"{name}/{dtype}/{direction}"] = coefficients
    return cost.Calibration(out, "pinned (test)")


#: SDPA's kernel and blocksparse's pieces price an entry alike; blocksparse pays per kernel call (math has no work)
FAIR = table(sdpa={"call": 1e-5, "entries": 1e-10, "mask": 1e-9},
             blocksparse={"call": 2e-5, "kernels": 5e-5, "entries": 1e-10, "mask": 1e-9, "gather": 1e-9, "tiled": 3e-10,
                          "table": 2e-10, "mask_eval": 1e-9},
             eager={"call": 5e-6, "entries": 5e-10, "scores": 1e-8},
             math={"call": 1e-5, "entries": 2e-9, "scores": 2e-8})


def qkv(L, Lq=None, H=8, Hkv=2, dtype=torch.float32, grad=False):
    q = torch.randn(1, H, Lq or L, 64, dtype=dtype, requires_grad=grad)
    k = torch.randn(1, Hkv, L, 64, dtype=dtype, requires_grad=grad)
    return q, k, k.detach().clone().requires_grad_(grad)


def chosen(L, mask, Lq=None, **kwargs):
    q, k, v = qkv(L, Lq, grad=kwargs.pop("grad", False))
    return ak.explain(q, k, v, mask if not callable(mask) else mask(L), **kwargs)


@pytest.mark.parametrize("mask, L, expected", [
    (M.causal() & M.sliding_window(128), 1024, "blocksparse"),  # issue 32's cells: a third of the entries
    (M.causal() & M.sliding_window(512), 2048, "blocksparse"),
    (M.chunked(256) & M.causal(), 1024, "blocksparse"),
    (M.causal(), 1024, "sdpa"),  # SDPA's causal flag computes the triangle in one call
    (None, 1024, "sdpa"),
    (M.causal() & M.sliding_window(2048), 1024, "blocksparse"),  # a window past L is causal: one is_causal piece
])
def test_auto_takes_the_cheapest_predicted_backend(mask, L, expected):
    with cost.use(FAIR):
        e = chosen(L, M.prepare(mask, L) if mask is not None else None)
    assert e.chosen == expected, str(e)
    assert e.costs[e.chosen].seconds == min(c.seconds for n, c in e.costs.items() if e.ranks[n].score >= 0)


def test_the_same_call_flips_when_the_calibration_does():
    mask = M.prepare(M.causal() & M.sliding_window(128), 1024)
    pricey_pieces = table(**{**{k.split("/")[0]: v for k, v in FAIR.table.items()},
                             "blocksparse": {"call": 2e-5, "kernels": 0.5, "entries": 1e-10}})
    with cost.use(FAIR):
        assert chosen(1024, mask).chosen == "blocksparse"
    with cost.use(pricey_pieces):
        assert chosen(1024, mask).chosen == "sdpa"
    with cost.use(None):  # no calibration: by rank (blocksparse ranks itself low below 4096 keys)
        assert chosen(1024, mask).chosen == "sdpa"


def test_the_direction_and_dtype_pick_their_own_coefficients():
    base = {k.split("/")[0]: v for k, v in FAIR.table.items()}
    calibration = table(**base)
    slow_training = dict(calibration.table)
    for dtype in ("float32", "bfloat16"):  # blocksparse's backward is priced out; its forward is not
        slow_training[f"blocksparse/{dtype}/train"] = {"call": 1.0}
    mask = M.prepare(M.causal() & M.sliding_window(128), 1024)
    with cost.use(cost.Calibration(slow_training)):
        assert chosen(1024, mask).chosen == "blocksparse"
        assert chosen(1024, mask, grad=True).chosen == "sdpa"
    assert cost.Calibration(slow_training).coefficients("blocksparse", torch.float16, "train") == {"call": 1.0}
    assert cost.Calibration({}).coefficients("sdpa", torch.float32, "forward") is None


def test_decode_steps():
    window = M.prepare(M.causal() & M.sliding_window(128), torch.tensor([4095]), 4096)
    with cost.use(FAIR):
        e = chosen(4096, window, Lq=1)
        assert e.chosen == "blocksparse", str(e)  # one piece of 128 keys against 4096 dense entries
        assert e.costs["blocksparse"].seconds < e.costs["sdpa"].seconds
        e = chosen(4096, M.causal(), Lq=1)  # the last position sees every key: SDPA without a mask, one call
        assert e.chosen == "sdpa", str(e)


class _Unpriced:
    """No ``work``: competes by rank against the cheapest priced backend's rank score."""

    name = "unpriced"
    ranks_by_signature = True

    def __init__(self, score):
        self.score = score

    def available(self):
        return []

    def supports(self, call):
        return []

    def rank(self, call):
        return Rank(self.score, "test backend")

    def plan(self, call):
        return "test"

    def __call__(self, call):
        return registry.get("math")(call)


@pytest.mark.parametrize("score, expected", [(1000, "unpriced"), (5, "blocksparse"), (-1, "blocksparse")])
def test_a_backend_without_work_competes_by_rank(score, expected):
    registry.register(_Unpriced(score))
    try:
        with cost.use(FAIR):
            e = chosen(1024, M.prepare(M.causal() & M.sliding_window(128), 1024))
        assert e.chosen == expected, str(e)
        assert "unpriced" not in e.costs
    finally:
        registry.unregister("unpriced")


def test_explain_prints_every_capable_backends_predicted_time_and_its_parts():
    with cost.use(FAIR):
        e = chosen(1024, M.prepare(M.causal() & M.sliding_window(128), 1024))
    text = str(e)
    assert set(e.costs) == {"sdpa", "blocksparse"}  # eager: priced up to 512 x 512 entries per head; math never
    assert f"sdpa: could serve, predicted {e.costs['sdpa']}" in text
    assert "math: could serve, ranks lower" in text
    with cost.use(FAIR):
        short = chosen(256, M.prepare(M.causal() & M.sliding_window(128), 256))
    assert set(short.costs) == {"sdpa", "blocksparse", "eager"}  # (eager ranks -5 here, but is priced)
    assert any(w.startswith(f"predicted {e.costs['blocksparse']}") for w in e.why), e.why
    parts = dict((n, s) for n, _, s in e.costs["blocksparse"].parts)
    assert parts["kernels"] == pytest.approx(5e-5 * dict((n, a) for n, a, _ in e.costs["blocksparse"].parts)["kernels"])
    assert sum(parts.values()) == pytest.approx(e.costs["blocksparse"].seconds)
    assert "pinned (test)" in text


def test_auto_memo_follows_the_calibration():
    mask = M.prepare(M.causal() & M.sliding_window(128), 1024)
    q, k, v = qkv(1024)
    call = _validation.build_call(q, k, v, mask)
    with cost.use(FAIR):
        assert registry.select(call).name == "blocksparse"
    with cost.use(None):
        assert registry.select(call).name == "sdpa"  # the memoised choice was not served across calibrations


def test_a_calibration_round_trips_through_the_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNKIT_CALIBRATION", "")
    monkeypatch.setattr(cost, "_LOADED", {})
    path = cost.save(FAIR, "cpu")
    assert path.parent.parent == tmp_path and torch.__version__.replace("+", "-") in path.name
    loaded = cost.active(torch.device("cpu"))
    assert loaded.table == {k: dict(v) for k, v in FAIR.table.items()} and loaded.source == str(path)
    path.write_text("not json")
    monkeypatch.setattr(cost, "_LOADED", {})
    assert cost.active(torch.device("cpu")) is cost.DEFAULT_CALIBRATION  # unreadable: the built-in defaults
    assert json.loads(json.dumps(FAIR.to_json()))["table"] == FAIR.to_json()["table"]


def test_without_a_calibration_another_device_routes_by_rank(monkeypatch):
    monkeypatch.setattr(cost, "_LOADED", {})
    monkeypatch.setattr(cost, "calibration_path", lambda device: cost.cache_dir() / "none" / "missing.json")
    assert cost.active(torch.device("meta")) is None
    assert cost.active(torch.device("cpu")) is cost.DEFAULT_CALIBRATION


def test_the_fit_recovers_known_coefficients_without_a_clock():
    truth = {"call": 2e-5, "entries": 3e-10, "kernels": 1e-4}
    works = [{"call": 1.0, "entries": e, "kernels": n} for e in (1e6, 1e7, 1e8, 3e8) for n in (1, 3, 9)]
    samples = [(w, sum(truth[k] * a for k, a in w.items())) for w in works]
    fitted = tune.fit(samples)
    for name, value in truth.items():
        assert fitted[name] == pytest.approx(value, rel=1e-6)
