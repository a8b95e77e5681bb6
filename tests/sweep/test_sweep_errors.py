"""Every refusal of the sweep that the other tests do not reach: one line naming the argument (or the flag)."""

from __future__ import annotations

import json

import optuna
import pytest

from attnkit.cli.main import main
from attnkit.errors import AttnkitValueError
from attnkit.sweep import SweepConfig, resume_sweep
from attnkit.sweep.folder import write_manifest
from attnkit.sweep.run import open_context
from attnkit.sweep.space import normalised
from attnkit.sweep.storage import default_url, open_storage, quiet_optuna
from attnkit.sweep.study import load_study


def test_bad_settings_name_the_argument():
    with pytest.raises(AttnkitValueError, match=r"preset='huge' is not a preset; choose one of"):
        SweepConfig(preset="huge", trial_steps=1)
    with pytest.raises(AttnkitValueError, match=r"an empty space= names no knob"):
        SweepConfig(space={}, trial_steps=1)
    with pytest.raises(AttnkitValueError, match=r"minutes must be > 0, got -1"):
        SweepConfig(minutes=-1)
    with pytest.raises(AttnkitValueError, match=r"space= must be a dict of knob -> values, got list"):
        normalised(["heads=1"])


def test_resume_needs_a_sweep_folder(tmp_path):
    with pytest.raises(AttnkitValueError, match=r"resume='.*' holds no sweep \(no sweep.json of attnkit sweep\)"):
        resume_sweep(tmp_path)


def test_a_storage_password_is_never_kept_so_resume_asks_for_it(tmp_path):
    write_manifest(tmp_path, {"role": "creator", "sweep_id": "x", "study": "s", "storage": "postgresql://u:***@h/db",
                              "config": {}, "finished_trial": False})
    assert "***" in json.loads((tmp_path / "sweep.json").read_text())["storage"]
    with pytest.raises(AttnkitValueError, match=r"whose password is not kept; pass storage= again with the password"):
        open_context(tmp_path, None)


def test_a_study_that_is_missing_or_not_a_sweep_is_named(tmp_path):
    storage = open_storage(default_url(tmp_path))
    with pytest.raises(AttnkitValueError, match=r"study='nope' is not in storage='sqlite:///.*' \(it holds \[\]\)"):
        load_study(storage, "nope")
    optuna.create_study(storage=storage, study_name="plain")
    with pytest.raises(AttnkitValueError, match=r"study='plain' was not made by attnkit sweep"):
        load_study(storage, "plain")


def test_resume_and_join_refuse_the_settings_of_a_new_sweep(tmp_path, capsys):
    assert main(["sweep", "--resume", str(tmp_path), "--space", "heads=1", "--trials", "3"]) == 2
    err = capsys.readouterr().err
    assert f"--resume '{tmp_path}' keeps the sweep's own settings (in its study); --trials, --space can't" in err
    assert main(["sweep", "--join", "--storage", default_url(tmp_path)]) == 2
    assert "--join needs the shared study: pass --storage (its database URL) and --study" in capsys.readouterr().err


def test_a_space_whose_draws_cannot_be_built_is_refused_after_many_in_a_row(tmp_path, monkeypatch):
    from attnkit.sweep import trial as trials
    from attnkit.sweep.config import Plan
    from attnkit.sweep.study import Context, create_study

    monkeypatch.setattr(trials, "MAX_INFEASIBLE", 1)
    config = SweepConfig(run_dir=str(tmp_path), preset="nano", trial_steps=1, space={"heads": [2, 4],
                                                                                      "kv_heads": [4]})
    plan = Plan(trials=3, trial_seconds=None, trial_steps=1, expected_steps=1, eval_every=1, warmup=1,
                precision="fp32", threads=1, seeds=0)
    storage = open_storage(default_url(tmp_path))
    study = create_study(storage, "s", config, plan, {"config": config.to_dict(), "plan": plan.to_dict()})
    study.enqueue_trial({"heads": 2, "kv_heads": 4})
    ctx = Context(tmp_path, config, study, storage, "id", {"heads": 8, "kv_heads": "heads", "width": 64})
    with quiet_optuna():
        ctx.study.tell(study.ask(), 1.0)  # the baseline waits first (trial #0): done
        draw = study.ask()  # the enqueued combination, which no model can be built from
    with pytest.raises(AttnkitValueError, match=r"space='heads=2,4 kv_heads=4': 1 draws in a row could not be built "
                                                r"\(e.g. num_heads=2 must be a multiple of num_kv_heads=4"):
        trials.run_trial(ctx, draw)
    assert study.trials[-1].user_attrs["outcome"].startswith("infeasible: num_heads=2 must be a multiple")


def test_a_trial_failed_as_stale_by_another_worker_stops_its_own_training(tmp_path):
    from optuna.trial import TrialState

    from attnkit.sweep.trial import Reporter, TakenOver

    storage = open_storage(default_url(tmp_path))
    study = optuna.create_study(storage=storage, study_name="s")
    with quiet_optuna():
        trial = study.ask()
    reporter = Reporter(trial, prune=False)
    reporter(None, {"step": 1, "val_loss": 2.0})  # reported while it runs
    storage.set_trial_state_values(storage.get_trial_id_from_study_id_trial_number(
        storage.get_study_id_from_name("s"), trial.number), state=TrialState.FAIL)  # another worker: "stale"
    with pytest.raises(TakenOver, match=f"trial #{trial.number}"):
        reporter(None, {"step": 2, "val_loss": 1.9})
