"""Reading a run folder (attnkit.runs.read): the doctor, the report and ``generate`` load runs without the trainer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnkit.training as training_loop
from attnkit.models.builders import build_lm
from attnkit.runs import read as io
from attnkit.runs import tokens
from attnkit.runs import write as checkpoint
from attnkit.training import data, metrics

SRC = Path(io.__file__).resolve().parents[2]


@pytest.fixture
def run(tmp_path):
    torch.manual_seed(0)
    model = build_lm("nano")
    folder = tmp_path / "run"
    checkpoint.save_checkpoint(folder, 3, model, None, {"model_config": model.config.to_dict(), "run_id": "r1"})
    (folder / "config.json").write_text(json.dumps({"train": {}, "model": model.config.to_dict(), "run_id": "r1"}))
    return folder, model


def test_load_model_returns_the_saved_weights_in_eval_mode(run):
    folder, model = run
    loaded = io.load_model(folder)
    assert not loaded.training and type(loaded) is type(model)
    want, got = model.state_dict(), loaded.state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)


def test_the_doctor_loads_a_run_without_importing_the_trainer(run):
    """issue 11: "the doctor does not import training for loading" (the import walk checks the source; this checks
    what really runs: on the old main, load_target imported attnkit.training.loop)."""
    folder, _ = run
    code = ("import sys\nfrom attnkit.runs import open_source\n"
            f"source = open_source({str(folder)!r}); model, fresh = source.model, source.fresh\n"
            "print(type(model).__name__, fresh, sorted(m for m in sys.modules if m.startswith('attnkit.training')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["TransformerLM", "False", "[]"], out.stdout


def test_the_trainer_uses_the_one_reader():
    # nothing is duplicated: the trainer's names are the run reader's objects, and the writer forwards none of them
    assert training_loop.load_model is io.load_model
    assert not any(hasattr(checkpoint, name) for name in ("read_state", "resolve", "load_weights", "CheckpointError",
                                                          "load_file"))
    assert data.ByteTokenizer is tokens.ByteTokenizer and metrics.read_metrics is io.read_metrics


def test_a_run_folder_is_told_from_a_hugging_face_folder(run, tmp_path):
    folder, _ = run
    assert io.is_run_folder(folder) and io.is_checkpoint_or_run(io.resolve(folder))
    assert not io.is_run_folder(io.resolve(folder))  # a checkpoint folder is not a run folder (a new run refuses it)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1}))
    assert not io.is_run_folder(hf) and not io.is_checkpoint_or_run(hf)
    starting = tmp_path / "starting"  # the trainer wrote config.json, no checkpoint yet
    starting.mkdir()
    (starting / "config.json").write_text((folder / "config.json").read_text())
    assert io.is_run_folder(starting)
    with pytest.raises(io.CheckpointError, match=r"no checkpoint found in .*starting'.*train one there first \(run_dir=\)"):
        io.load_model(starting)


def test_a_model_of_another_shape_is_refused_naming_the_tensor(run):
    folder, _ = run
    with pytest.raises(io.CheckpointError, match=r"does not fit the model: .* in the checkpoint but .* in the model "
                                                 r"built from the config; .*attnkit.runs.load_model does"):
        io.load_weights(io.resolve(folder), build_lm("nano", embed_dim=128))


def test_read_metrics_drops_a_line_cut_by_a_kill(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"st')
    with pytest.warns(UserWarning, match=r"skipped 1 line\(s\) .*line 3: not JSON"):
        assert io.read_metrics(path) == [{"step": 1}, {"step": 2}]
    assert io.read_metrics(tmp_path / "none.jsonl") == []
