"""Benchmarks honest on a busy machine (issue 31 item 4): every suite runs with its threads pinned (1 unless the
suite or OMP_NUM_THREADS chooses) and printed, the load recorded in every results file, a warning when the load
leaves the benchmark less than a core per thread, a heartbeat line while it runs; `bench dispatch` says "can't say"
for a target whose cells' ratios spread more than 20% instead of "NOT met"."""

import argparse
import io
import json
import time

import pytest
import torch

from attnkit.bench import common, dispatch
from attnkit.cli.bench import checked


@pytest.fixture(autouse=True)
def restore_threads():
    threads = torch.get_num_threads()
    yield
    common.end()
    torch.set_num_threads(threads)


def test_begin_pins_one_thread_prints_it_and_end_gives_them_back(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    err = io.StringIO()
    got = common.begin("probe", stream=err)
    assert torch.get_num_threads() == 1 and got["threads"] == 1 and got["threads_set_by"].startswith("pinned")
    assert err.getvalue().startswith("bench probe: 1 torch thread(s) (pinned by attnkit bench (set OMP_NUM_THREADS=N")
    common.end()
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize(("env", "flag", "why"), [({"OMP_NUM_THREADS": "2"}, False, "OMP_NUM_THREADS=2"),
                                                  ({}, True, "the suite's --threads")])
def test_a_thread_count_someone_chose_is_kept(env, flag, why, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    torch.set_num_threads(2)
    got = common.begin("probe", threads_flag=flag, stream=io.StringIO())
    assert torch.get_num_threads() == 2 and got["threads_set_by"] == why


def test_a_busy_machine_is_warned_of_and_recorded(monkeypatch, tmp_path):
    monkeypatch.setattr(common, "load_1min", lambda: 5.5)
    monkeypatch.setattr(common.os, "cpu_count", lambda: 2)
    err = io.StringIO()
    common.begin("probe", stream=err)
    assert "bench probe: warning: the 1-minute load is 5.5 on 2 CPUs" in err.getvalue()
    record = json.loads(common.write_results("probe", {"x": 1}, tmp_path).read_text())
    assert record["conditions"]["busy"] is True and record["conditions"]["load_1min_start"] == 5.5
    assert record["conditions"]["load_1min_end"] == 5.5 and record["conditions"]["threads"] == 1
    assert "Re-run on a quiet machine" in record["conditions"]["warning"]


def test_the_busy_rule():
    assert common.busy_warning(0.5, 1, 2) is None and common.busy_warning(1.0, 1, 2) is None  # a core is free
    assert common.busy_warning(1.5, 1, 2) is not None and common.busy_warning(0.5, 2, 2) is not None
    assert common.busy_warning(None, 1, 2) is None  # no load average here: nothing to say


def test_results_written_outside_a_suite_still_say_their_threads_and_load(tmp_path):
    common.end()
    common.CONDITIONS.clear()
    record = json.loads(common.write_results("probe", {}, tmp_path).read_text())
    assert record["conditions"]["threads"] == torch.get_num_threads() and "load_1min_end" in record["conditions"]


def test_every_suite_gets_a_heartbeat_while_it_times(monkeypatch):
    monkeypatch.setattr(common, "HEARTBEAT_S", 0.05)
    err = io.StringIO()
    monkeypatch.setattr(common.sys, "stderr", err)
    parser = argparse.ArgumentParser()

    def suite(args):
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            common.round_robin({"a": lambda: None, "b": lambda: None}, 10, warmup=0)
        return 0

    assert checked(parser, suite)(argparse.Namespace(suite="probe")) == 0
    lines = [line for line in err.getvalue().splitlines() if line.startswith("bench probe: running, ")]
    assert lines and "timed calls so far" in lines[-1], err.getvalue()
    count = len(lines)
    time.sleep(0.2)
    assert len([line for line in err.getvalue().splitlines() if "running" in line]) == count  # stopped at the end


def _rows(spreads):
    return [{"dtype": "float32", "ctx": 512, "ratio": 0.9, "ratio_prepared": 0.95, "spread": s,
             "unstable": s > dispatch.UNSTABLE} for s in spreads]


def test_a_target_is_judged_only_on_cells_known_to_20_percent():
    stable = dispatch.summarise(_rows([0.05, 0.1]))["float32 ctx=512"]
    assert stable["met"] is True and stable["unstable_cells"] == 0
    shaky = dispatch.summarise(_rows([0.05, 0.6]))["float32 ctx=512"]
    assert shaky["met"] is None and shaky["unstable_cells"] == 1  # "can't say", never "NOT met" on noise
    assert dispatch.spread([1.0, 1.0, 1.0, 1.0, 1.0]) == 0
    assert dispatch.spread([0.5, 0.9, 1.0, 1.1, 3.0]) == pytest.approx(0.2)


def test_round_robin_hands_out_its_samples_and_a_slowed_cell_is_unstable(monkeypatch):
    samples = {}
    common.round_robin({"a": lambda: None, "b": lambda: None}, 7, warmup=0, samples=samples)
    assert sorted(samples) == ["a", "b"] and all(len(ts) == 7 and min(ts) > 0 for ts in samples.values())
    quiet = dispatch.decode_cell(1, 1, "GQA", torch.float32, 32, 10)
    assert {"spread", "inflation", "unstable"} <= set(quiet) and quiet["inflation"] >= 1.0

    real = common.round_robin

    def slowed(fns, repeats, warmup=2, device=None, seed=0, samples=None):  # most calls 3x their fastest
        out = real(fns, repeats, warmup, device, seed, samples)
        for ts in samples.values():
            ts[:] = [ts[0]] + [3 * ts[0]] * (len(ts) - 1)
        return out

    monkeypatch.setattr(dispatch, "round_robin", slowed)
    cell = dispatch.decode_cell(1, 1, "GQA", torch.float32, 32, 10)
    assert cell["inflation"] == pytest.approx(3.0) and cell["unstable"]
