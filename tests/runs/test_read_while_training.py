"""Reading a run while it trains (issue 21 item 20): when the trainer prunes the checkpoint being read, a reader
of the run folder takes the newest one instead, and a reader of that checkpoint is told what happened and what to
read; a healthy run is never called damaged (nor is anyone told to train it again)."""

import shutil
import sys
from pathlib import Path

import pytest

from attnkit.cli.main import main
from attnkit.runs import read

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from train_helpers import small_config  # noqa: E402

from attnkit.training import train  # noqa: E402


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("pruned") / "run"
    train(small_config(run, steps=8, ckpt_every=4), log=lambda *a, **k: None)
    return run


@pytest.fixture
def pruned_while_read(trained, tmp_path, monkeypatch):
    """A copy of the run whose newest checkpoint is deleted (as the trainer prunes it) the moment it is read."""
    run = tmp_path / "run"
    shutil.copytree(trained, run, ignore=shutil.ignore_patterns(".attnkit.lock"))
    newest = read.list_checkpoints(run)[-1]
    original = read.open_regular

    def open_then_prune(path):
        path = Path(path)
        if path.parent == newest and path.name == "model.safetensors" and newest.exists():
            shutil.rmtree(newest)  # the trainer's prune, between the manifest and the weights
        return original(path)

    monkeypatch.setattr(read, "open_regular", open_then_prune)
    return run, newest


def test_a_run_folder_read_while_pruned_gives_its_newest_checkpoint(pruned_while_read):
    run, _ = pruned_while_read
    model = read.load_model(run)
    assert model.config.vocab_size == 257  # step 4's checkpoint, read in full


def test_the_checkpoint_itself_read_while_pruned_says_what_happened(pruned_while_read):
    run, newest = pruned_while_read
    with pytest.raises(read.CheckpointGone, match=rf"checkpoint '{newest}' was removed while it was read: the run is "
                                                  r"still training and keeps only its newest checkpoints \(keep=\); "
                                                  rf"read the newest, {run}/checkpoints/step_00000004"):
        read.load_model(newest)


def test_doctor_on_a_run_read_while_pruned_passes(pruned_while_read, capsys):
    run, _ = pruned_while_read
    assert main(["doctor", str(run), "--checks", "causal-leak"]) == 0
    captured = capsys.readouterr()
    assert "again" not in captured.err and "damaged" not in captured.err
