"""Disk full, file too large, read-only (issue 21 item 19): a typed message naming the path and the OS error,
exit 2 on the command line, no traceback, nothing half-written left behind (and an --overwrite's old run back)."""

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import cli_args, small_config

from attnkit.cli.main import main
from attnkit.runs import write as ckpt
from attnkit.runs.write import WriteFailed
from attnkit.training import train


def _quiet(*args, **kwargs):
    pass


def _file_size_limit(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead of killing the process
    return apply


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_checkpoint_larger_than_the_file_size_limit_is_a_typed_error(tmp_path):
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "attnkit.cli.main", *cli_args(run, "--steps", "2")], env=env,
                          capture_output=True, text=True, timeout=120, preexec_fn=_file_size_limit(200_000))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert f"could not write '{run}/checkpoints/step_00000001': File too large (EFBIG); the file is larger than " \
           "this system allows" in done.stderr
    assert "Nothing half-written was left behind" in done.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == []  # no temporary folder left


def test_disk_full_while_writing_a_checkpoint_restores_an_overwritten_run(tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(small_config(run, steps=4, ckpt_every=4), log=_quiet)
    old = (run / "config.json").read_text()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt, "save_file", full)
    with pytest.raises(WriteFailed, match=rf"could not write '{run}/checkpoints/step_00000002': No space left on "
                                          r"device \(ENOSPC\); free space on that disk or write somewhere else"):
        train(small_config(run, steps=4, ckpt_every=2, overwrite=True), log=_quiet)
    assert (run / "config.json").read_text() == old  # the old run is back
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000004"]


def test_a_read_only_folder_is_a_typed_error_on_the_command_line(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    assert main(cli_args(run, "--steps", "2")) == 2
    err = capsys.readouterr().err
    assert f"could not write '{run}/.attnkit.lock': Read-only file system (EROFS); that file system is read-only: " \
           "write somewhere else" in err
    assert not run.exists()


def test_an_os_error_of_an_unnamed_write_still_names_its_path(monkeypatch, capsys):
    from attnkit.cli import masks

    def full(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/somewhere/out.png")

    monkeypatch.setattr(masks, "run", full)
    assert main(["masks", "causal"]) == 2
    err = capsys.readouterr().err
    assert "could not write '/somewhere/out.png': No space left on device (ENOSPC)" in err
    assert "half-written" not in err  # not known for a write the library did not make
