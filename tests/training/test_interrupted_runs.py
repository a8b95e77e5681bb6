"""An interrupted run is still a run (issue 21 items 8 and 8b): a folder with a run's config and metrics but no
checkpoint is refused without --overwrite; the report of one checkpoint goes into the run folder, not into the
checkpoint (pruning would delete it); a run that a stopped --overwrite set aside in .replaced/ is named, with how
to get it back, by every reader that finds no checkpoint, and --resume puts it back."""

import shutil

import pytest
from train_helpers import copy_run, quiet, small_config, trained_run

from attnkit.cli.main import main
from attnkit.runs import read as reader
from attnkit.runs.folder import RunFolderError
from attnkit.training import train
from attnkit.training.metrics import read_metrics

_quiet = quiet


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    return trained_run(tmp_path_factory, "interrupted", steps=8, ckpt_every=4)


def _copy(run, tmp_path):
    return copy_run(run, tmp_path, "run")


def test_a_run_stopped_before_its_first_checkpoint_is_not_replaced_without_overwrite(trained, tmp_path):
    run = _copy(trained, tmp_path)
    shutil.rmtree(run / "checkpoints")  # what a kill before the first checkpoint leaves: config.json, metrics.jsonl
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    with pytest.raises(RunFolderError, match=r"run_dir='.*run' holds a run that has no checkpoint \(its config.json, "
                                             r"metrics.jsonl, loss.png: it was stopped before its first checkpoint\); "
                                             r"pick another run_dir=, or pass overwrite=True"):
        train(small_config(run, steps=4), log=_quiet)
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert main(["train", "--run-dir", str(run), "--steps", "2"]) == 2  # the same refusal on the command line
    train(small_config(run, steps=4, overwrite=True), log=_quiet)
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]


def test_the_report_of_a_checkpoint_goes_into_the_run_folder(trained, tmp_path, monkeypatch):
    run = _copy(trained, tmp_path)
    monkeypatch.chdir(tmp_path)
    step = reader.list_checkpoints(run)[-1]
    assert main(["report", str(step), "--no-doctor", "--text", "def f"]) == 0
    assert (run / f"report-{step.name}.html").is_file()
    assert not (step / "report.html").exists() and not list(step.glob("*.html"))
    assert main(["report", str(run), "--no-doctor", "--text", "def f"]) == 0
    assert (run / "report.html").is_file()


def _stopped_overwrite(trained, tmp_path):
    """The folder as a SIGKILL leaves an --overwrite run before its first checkpoint: the old run in .replaced/."""
    run = _copy(trained, tmp_path)
    aside = run / ".replaced"
    aside.mkdir()
    for name in ("checkpoints", "config.json", "metrics.jsonl", "loss.png"):
        shutil.move(str(run / name), aside / name)
    (run / "config.json").write_text((aside / "config.json").read_text().replace('"run_id": "', '"run_id": "new'))
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 5.0}\n')
    return run, aside


@pytest.mark.parametrize("command", [["doctor"], ["generate", "--prompt", "x"], ["report", "--no-doctor"]])
def test_readers_name_the_set_aside_run_and_how_to_restore_it(trained, tmp_path, capsys, command):
    run, aside = _stopped_overwrite(trained, tmp_path)
    assert main([command[0], str(run), *command[1:]]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"no checkpoint found in '{run}': the run that was here is intact in '{aside}' (newest checkpoint " \
           "step_00000008)" in err
    assert f"training again with --resume {str(run)!r} puts it back and continues it" in err


def test_resume_puts_the_set_aside_run_back_and_continues_it(trained, tmp_path):
    run, aside = _stopped_overwrite(trained, tmp_path)
    old_config = (aside / "config.json").read_text()
    result = train(small_config(run, steps=10), resume=run, given={"steps"}, log=_quiet)
    assert result.step == 10 and not aside.exists()
    assert (run / "config.json").read_text() == old_config
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 11))
