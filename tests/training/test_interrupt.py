"""An interrupted run keeps its work (issue 21 item 7): SIGINT/SIGTERM checkpoint the current step, print the
resume command without a traceback and release the lock; a run without ``ckpt_every`` checkpoints a tenth of
the way, so short runs (``make demo``, ``--minutes``) have checkpoints long before their end."""

import os
import signal
import subprocess
import sys
import time

import pytest
from train_helpers import cli_args, small_config

from attnkit.runs import read as reader
from attnkit.runs.folder import RunFolder
from attnkit.training import train
from attnkit.training.interrupt import TrainingInterrupted
from attnkit.training.metrics import read_metrics
from attnkit.training.record import checkpoint_interval


def _quiet(*args, **kwargs):
    pass


@pytest.mark.parametrize(("ckpt_every", "total", "expected"), [(None, 81, 9), (None, 5, 1), (None, 1000, 100),
                                                                (None, 50_000, 100), (7, 81, 7)])
def test_the_default_checkpoint_interval_is_a_tenth_of_the_run(ckpt_every, total, expected):
    assert checkpoint_interval(ckpt_every, total) == expected


def test_a_run_without_ckpt_every_has_checkpoints_before_its_end(tmp_path):
    seen = []
    config = small_config(tmp_path / "run", steps=20, ckpt_every=None, keep=100)
    train(config, log=_quiet, hooks=[lambda t, r: seen.append([p.name for p in reader.list_checkpoints(t.run_dir)])])
    assert seen[3] == ["step_00000002"]  # after step 4's hook (before its save): step 2's checkpoint exists
    assert [p.name for p in reader.list_checkpoints(tmp_path / "run")] == [f"step_{s:08d}" for s in range(2, 21, 2)]


def test_a_stop_request_checkpoints_the_current_step_and_raises(tmp_path):
    def stop_at_5(trainer, record):
        if record["step"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the request; the step finishes

    run = tmp_path / "run"
    with pytest.raises(TrainingInterrupted, match=r"stopped by SIGTERM after step 5/12: checkpoint .*step_00000005 "
                                                  r"written; continue the run with resume .*run") as info:
        train(small_config(run, steps=12, ckpt_every=4), log=_quiet, hooks=[stop_at_5])
    assert info.value.step == 5 and info.value.signum == signal.SIGTERM
    assert [p.name for p in reader.list_checkpoints(run)] == ["step_00000004", "step_00000005"]
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4, 5]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back
    RunFolder(run, log=_quiet).acquire().release()  # the lock was released
    result = train(small_config(run, steps=12, ckpt_every=4), resume=run, log=_quiet)
    assert result.step == 12
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 13))


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_on_the_command_line_saves_prints_the_resume_command_and_exits(tmp_path, sig):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "attnkit.cli.main", *cli_args(run, "--steps", "100000")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(read_metrics(run / "metrics.jsonl")) < 3:  # training has started
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl")]
    newest = reader.list_checkpoints(run)[-1]
    assert newest.name == f"step_{steps[-1]:08d}"  # the step it stopped after is checkpointed
    assert f"resume with: attnkit train --resume {run}" in err
    assert f"stopped by {signal.Signals(sig).name} after step {steps[-1]}/100000" in err
    assert not RunFolder(run, log=_quiet).acquire().release()  # the lock was released


def test_each_checkpoint_is_said_on_a_line_clear_of_the_progress_bar(tmp_path, monkeypatch):
    """Issue 31.5: a checkpoint is said on a line of its own, printed with the progress bar cleared (tqdm's
    external write mode), so the bar and the line never share a row."""
    import contextlib

    from attnkit.training import loop

    events = []

    class Bar:  # the calls the loop makes on a tqdm bar
        total = 0

        @classmethod
        @contextlib.contextmanager
        def external_write_mode(cls):
            events.append("clear")
            yield
            events.append("draw")

        def set_postfix(self, **kw):
            pass

        def update(self, n=1):
            pass

        def refresh(self):
            pass

        def close(self):
            events.append("closed")

    monkeypatch.setattr(loop, "progress_bar", lambda *a, **k: Bar())
    train(small_config(tmp_path / "run", steps=8, ckpt_every=4, progress=True), log=events.append)
    lines = [e for e in events if e.startswith("checkpoint ") and " written (step " in e]
    assert [line.split(" written")[0].rsplit("/", 1)[-1] for line in lines] == ["step_00000004", "step_00000008"]
    for line in lines:
        i = events.index(line)
        assert events[i - 1] == "clear" and events[i + 1] == "draw"
