"""A whole small sweep: a baseline and trials that are ordinary run folders, the verdict, the summary and its
figure; the same refusals as ``train`` for a folder that holds something."""

from __future__ import annotations

import json

import pytest
from helpers import load, quiet, small
from optuna.trial import TrialState

from attnkit.cli.main import main
from attnkit.runs import load_model, read_metrics
from attnkit.runs.folder import RunFolderError
from attnkit.sweep import resume_sweep, run_sweep


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    import torch

    before = torch.get_num_threads()  # (the one-thread fixture is per test: this one runs before it)
    torch.set_num_threads(1)
    try:
        folder = tmp_path_factory.mktemp("sweep") / "s"
        summary = run_sweep(small(folder), log=quiet)
    finally:
        torch.set_num_threads(before)
    return folder, summary


def test_a_sweep_trains_the_baseline_first_then_its_trials_then_the_verdict(swept):
    folder, summary = swept
    trials = load(folder).get_trials()
    assert trials[0].user_attrs["role"] == "baseline" and trials[0].state == TrialState.COMPLETE
    assert trials[0].user_attrs["config"]["heads"] == 8 and trials[0].user_attrs["config"]["window"] == "none"
    counted = [t for t in trials if t.user_attrs.get("outcome", "").split(" ")[0] in ("complete", "pruned")]
    assert len(counted) == 4  # the plan: the baseline and 3 searched trials
    for t in counted:  # every trial's own settings reached its run
        run = json.loads((folder / t.user_attrs["run_dir"] / "config.json").read_text())
        assert run["model"]["num_heads"] == t.user_attrs["config"]["heads"]
        assert run["model"]["window"] == (None if t.user_attrs["config"]["window"] == "none" else 8)
    groups = summary["verdict"]["groups"]
    assert groups["baseline"]["trial"] == 0 and len(groups["baseline"]["runs"]) == 2
    best = min((t for t in trials[1:] if t.state == TrialState.COMPLETE), key=lambda t: t.value)
    assert groups["best"]["trial"] == best.number
    assert {r["seed"] for r in groups["best"]["runs"]} == {1, 2}
    assert summary["verdict"]["outcome"] in ("beats the baseline beyond seed noise", "is within seed noise of the "
                                             "baseline", "is worse than the baseline beyond seed noise")


def test_the_summary_has_its_verdict_table_and_figure(swept):
    folder, summary = swept
    text = (folder / "summary.md").read_text()
    assert text.count("\n| best | #") == 1 and "\n| baseline | #0 |" in text and "**Verdict.**" in text
    assert "![sweep](sweep.png)" in text and (folder / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert "optuna-dashboard sqlite:///" in text
    assert json.loads((folder / "summary.json").read_text())["verdict"]["words"] == summary["verdict"]["words"]


def test_every_trial_is_an_ordinary_run_folder(swept, tmp_path):
    folder, _ = swept
    trial = load(folder).trials[1]
    run = folder / trial.user_attrs["run_dir"]
    model = load_model(run)
    assert model.config.num_heads == trial.user_attrs["config"]["heads"]
    assert [r["val_loss"] for r in read_metrics(run / "metrics.jsonl") if "val_loss" in r][-1] == pytest.approx(
        trial.value if trial.value is not None else trial.intermediate_values[max(trial.intermediate_values)])
    assert main(["generate", str(run), "--prompt", "def ", "--max-new-tokens", "4"]) == 0


def test_a_pruned_trial_is_marked_and_its_folder_ends_at_the_evaluation_that_pruned_it(tmp_path):
    folder = tmp_path / "s"
    # lr 1e-5 cannot learn in 10 steps: every searched trial is worse than the baseline at each evaluation
    run_sweep(small(folder, trials=5, seeds=0, space={"lr": [1e-5, 2e-5, 3e-5, 4e-5]}), log=quiet)
    pruned = [t for t in load(folder).get_trials() if t.state == TrialState.PRUNED]
    assert pruned, "the median pruner stopped no trial"
    for t in pruned:
        step = int(t.user_attrs["outcome"].removeprefix("pruned at step "))
        assert step == max(t.intermediate_values) and step < 10
        assert read_metrics(folder / t.user_attrs["run_dir"] / "metrics.jsonl")[-1]["step"] == step


def test_a_folder_holding_a_sweep_is_refused_without_overwrite(swept, capsys):
    folder, _ = swept
    with pytest.raises(RunFolderError, match=r"already holds a sweep .*continue it with resume=.*overwrite=True"):
        run_sweep(small(folder), log=quiet)
    assert main(["sweep", "--run-dir", str(folder), "--trial-steps", "2", "--space", "heads=1"]) == 2
    assert (f"--run-dir '{folder}' already holds a sweep" in capsys.readouterr().err)


def test_a_training_run_or_other_files_are_refused_and_overwrite_replaces_only_after_a_finished_trial(tmp_path):
    from attnkit.training import train
    from attnkit.training.config import TrainConfig

    run = tmp_path / "run"
    train(TrainConfig(run_dir=str(run), preset="nano", data=small(tmp_path).data, seq_len=16, batch_size=2, steps=1,
                      precision="fp32", progress=False), log=quiet)
    with pytest.raises(RunFolderError, match="already holds checkpoints"):
        run_sweep(small(run), log=quiet)
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(RunFolderError, match="is not empty and is not an attnkit run"):
        run_sweep(small(other), log=quiet)
    run_sweep(small(run, overwrite=True, trials=2, seeds=0), log=quiet)
    assert not (run / "metrics.jsonl").exists() and (run / "summary.md").exists()  # the old run went, once replaced


def test_resuming_a_finished_sweep_trains_nothing_and_writes_the_same_summary(swept):
    folder, summary = swept
    before = [(t.number, t.state, t.value) for t in load(folder).get_trials()]
    again = resume_sweep(folder, log=quiet)
    assert [(t.number, t.state, t.value) for t in load(folder).get_trials()] == before
    assert again["verdict"] == summary["verdict"]
