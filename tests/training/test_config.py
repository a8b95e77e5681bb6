"""A run's settings as plain decisions: the overfit check's defaults live in TrainConfig (the library's check is the
CLI's), the CLI only names the settings, a resume's and a fine-tuning start's choices are functions of their inputs."""

from pathlib import Path

import pytest

from attnkit.cli.main import build_parser
from attnkit.cli.train import config_from_args, flag
from attnkit.models.builders import lm_config
from attnkit.training import TrainConfig
from attnkit.training.config import OVERFIT_DEFAULTS, RUN_DEFAULTS, init_config, resumed_config


def _cli(*argv) -> TrainConfig:
    return config_from_args(build_parser().parse_args(["train", *argv]))


def test_the_librarys_overfit_check_is_the_clis():
    """issue 20 item 3: TrainConfig(overfit=True) ran 1000 steps at a decaying 2e-3 with weight decay; the CLI 300
    at a constant 3e-3 without (its defaults lived in cli/train.py)."""
    assert TrainConfig(overfit=True) == _cli("--overfit")
    assert {name: getattr(TrainConfig(overfit=True), name) for name in OVERFIT_DEFAULTS} == OVERFIT_DEFAULTS
    assert {name: getattr(TrainConfig(), name) for name in RUN_DEFAULTS} == RUN_DEFAULTS == \
        {name: getattr(_cli(), name) for name in RUN_DEFAULTS}


def test_given_settings_win_over_the_overfit_defaults():
    assert TrainConfig(overfit=True, lr=2e-3, steps=5) == _cli("--overfit", "--lr", "2e-3", "--steps", "5")
    config = TrainConfig(overfit=True, lr=2e-3, steps=5)
    assert (config.lr, config.steps, config.warmup) == (2e-3, 5, OVERFIT_DEFAULTS["warmup"])
    assert TrainConfig.from_dict({**vars(TrainConfig()), "overfit": True}).lr == RUN_DEFAULTS["lr"]  # stored: kept


def test_the_cli_names_settings_by_its_flags():
    assert [flag(n) for n in ("num_kv_heads", "doc_mask", "init_from", "run_dir", "lr", "window")] == \
        ["--kv-heads", "--doc-mask", "--init-from", "--run-dir", "--lr", "--window"]


def _state(step=6, **train):
    saved = vars(TrainConfig(run_dir="old", steps=10, lr=3e-3, batch_size=4, **train))
    return {"step": step, "train_config": saved, "model_config": lm_config("nano").to_dict()}


def test_a_resume_keeps_the_runs_settings_and_notes_what_it_ignored(tmp_path):
    asked = TrainConfig(run_dir=str(tmp_path / "else"), steps=20, lr=0.5, batch_size=8)
    config, notes = resumed_config(asked, _state(), {"steps", "lr", "run_dir"}, tmp_path, flag)
    assert (config.steps, config.lr, config.batch_size, config.run_dir) == (20, 3e-3, 4, str(tmp_path))
    assert notes == [f"--resume keeps the run's own settings; ignored: --run-dir {str(tmp_path / 'else')!r} (the "
                     f"run's folder is {str(tmp_path)!r}), --lr 0.5 (the run has 0.003). To change them start a new "
                     "run from this checkpoint's weights with --init-from."]
    config, notes = resumed_config(asked, _state(), set(), Path(tmp_path))
    assert config.steps == 10 and notes == []  # steps not given: the run's own
    with pytest.raises(ValueError, match=r"steps 5 is below the checkpoint's step 6; a resume can only continue or "
                                         r"extend a run \(pass steps >= 6\)"):
        resumed_config(TrainConfig(steps=5), _state(), {"steps"}, tmp_path)


def test_a_fine_tuning_start_records_the_checkpoints_model(tmp_path):
    model = lm_config("nano")
    asked = TrainConfig(preset="tiny", model={"window": 4})
    config, notes = init_config(asked, _state(preset="nano"), {"preset", "model"}, tmp_path, model)
    assert config.preset == "nano" and config.model == model.to_dict() and config.seq_len == model.max_seq_len
    assert notes == [f"init_from builds the model of {tmp_path}: ignored preset 'tiny' (the checkpoint's run has "
                     "'nano'), window 4 (the checkpoint has None). To change the model, train a new run without "
                     "init_from."]
