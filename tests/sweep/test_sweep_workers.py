"""Past one process and one machine: workers on one study (SQLite in the sweep folder, and a real PostgreSQL server),
one of them killed with SIGKILL mid-trial: no trial run twice, none lost, the plan's count exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import CLI_SMALL, advisory_waiters, kill, load, running_with_checkpoint, sweep_cli, wait_for
from optuna.trial import TrialState

from attnkit.runs import read_metrics
from attnkit.sweep.study import finished

PLAN = ["--trial-steps", "160", "--trials", "4", "--seeds", "0", "--heartbeat-s", "1"]


def check_no_trial_twice_and_none_lost(folder: Path, storage: str | None, victim, planned: int) -> None:
    trials = load(folder, storage).get_trials()
    counted = [t for t in trials if finished(t)]
    assert len(counted) == planned, [(t.number, t.state, t.user_attrs.get("outcome")) for t in trials]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    searched = [json.dumps(t.user_attrs["config"], sort_keys=True) for t in counted if t.user_attrs["role"] == "search"]
    assert len(set(searched)) == len(searched), "a configuration was trained twice"
    killed = trials[victim.number]
    assert killed.state == TrialState.FAIL and killed.user_attrs["outcome"].startswith("interrupted")
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1 and finished(retries[0]) and retries[0].params == victim.params
    assert retries[0].user_attrs["resumed"] and retries[0].user_attrs["run_dir"] == victim.user_attrs["run_dir"]
    folders = [t.user_attrs["run_dir"] for t in counted]
    assert len(set(folders)) == len(folders)
    for run_dir in folders:  # each run trained its steps once: records 1..N, none repeated (a resume cuts back)
        steps = [r["step"] for r in read_metrics(folder / run_dir / "metrics.jsonl")]
        assert steps == list(range(1, len(steps) + 1)), run_dir


def kill_a_worker_mid_trial(folder: Path, storage: str | None, extra=()):
    args = ["--run-dir", str(folder), *CLI_SMALL, *PLAN, "--workers", "2", *extra]
    proc = sweep_cli(*args)
    try:
        wait_for(lambda: running_with_checkpoint(folder, storage) is not None, proc=proc, what="a trial's checkpoint")
        victim = running_with_checkpoint(folder, storage)
        kill(int(victim.user_attrs["owner"].rsplit(":", 1)[1]))
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert f"its trials [{victim.number}] are enqueued again" in err
    return victim


def test_two_workers_on_sqlite_a_killed_worker_loses_nothing(tmp_path):
    folder = tmp_path / "sweep"
    victim = kill_a_worker_mid_trial(folder, None)
    check_no_trial_twice_and_none_lost(folder, None, victim, planned=4)


def test_two_workers_on_postgresql_a_killed_worker_loses_nothing(tmp_path, postgres):
    folder = tmp_path / "sweep"
    victim = kill_a_worker_mid_trial(folder, postgres, ["--storage", postgres])
    check_no_trial_twice_and_none_lost(folder, postgres, victim, planned=4)


def test_a_second_machine_joins_through_postgresql_and_its_death_is_found_by_the_heartbeat(tmp_path, postgres):
    """Two "machines" (processes with their own folders): one starts the sweep, one joins; the joiner is killed
    mid-trial with nobody to tell the study: its trial goes stale (heartbeat) and the first one retries it.

    The test holds the study's claim lock until both processes wait on it, so the joiner gets one of the first two
    trials (never pruned) however slowly it starts: on a loaded machine the starter alone would otherwise finish the
    plan before the joiner has imported torch."""
    from attnkit.sweep import storage as stores

    first, second = tmp_path / "first", tmp_path / "second"
    starter = joiner = None
    try:
        with stores.study_lock(stores.open_storage(postgres), "shared"):
            starter = sweep_cli("--run-dir", str(first), *CLI_SMALL, *PLAN, "--storage", postgres, "--study", "shared")
            wait_for(lambda: (first / "sweep.json").exists(), proc=starter, what="the study")
            joiner = sweep_cli("--join", "--storage", postgres, "--study", "shared", "--run-dir", str(second))
            wait_for(lambda: advisory_waiters(postgres) == 2, proc=joiner, what="both machines waiting to claim")
        wait_for(lambda: running_with_checkpoint(second, postgres) is not None, proc=joiner,
                 what="the joiner's checkpoint")
        victim = running_with_checkpoint(second, postgres)
        kill(joiner.pid)
        joiner.wait()
        out, err = starter.communicate(timeout=300)
    finally:
        for p in (starter, joiner):
            if p is not None and p.poll() is None:
                p.kill()
    assert starter.returncode == 0, err
    import optuna

    trials = optuna.load_study(study_name="shared", storage=postgres).get_trials()
    assert trials[victim.number].state == TrialState.FAIL  # failed by the heartbeat, not by its dead worker
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == victim.number]
    assert len(retries) == 1 and finished(retries[0]) and retries[0].params == victim.params
    assert len([t for t in trials if finished(t)]) == 4
    assert (first / "summary.md").exists() and not (second / "summary.md").exists()


@pytest.mark.parametrize("url", ["postgresql://nobody@/none?host=/nonexistent&port=1"])
def test_an_unreachable_server_is_one_line(url, tmp_path):
    from attnkit.errors import EnvironmentUnsupportedError
    from attnkit.sweep.storage import open_storage

    with pytest.raises(EnvironmentUnsupportedError, match=r"storage='postgresql://nobody@/none.*' cannot be reached"):
        open_storage(url)
