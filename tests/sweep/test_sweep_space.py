"""The search space: how a user writes it, and one clear line naming the flag for every bad one."""

from __future__ import annotations

import re

import pytest

from attnkit.cli.main import main
from attnkit.errors import AttnkitValueError, EnvironmentUnsupportedError
from attnkit.sweep import SweepConfig, default_space, parse_words, read_toml
from attnkit.sweep.space import Choices, Range, build_problem, check_buildable, model_overrides, suggest


def test_words_toml_and_python_write_the_same_space(tmp_path):
    words = parse_words(["heads=1,2,4", "window=none,128", "lr=1e-4..1e-2", "kv_heads=heads,1"])
    (tmp_path / "s.toml").write_text('heads = [1, 2, 4]\nwindow = ["none", 128]\nlr = "1e-4..1e-2"\n'
                                     'kv_heads = ["heads", 1]\n')
    assert read_toml(tmp_path / "s.toml") == words
    assert SweepConfig(space={"heads": [1, 2, 4], "window": ["none", 128], "lr": "1e-4..1e-2",
                              "kv_heads": ["heads", 1]}, trial_steps=1).space == words
    assert words["heads"] == Choices((1, 2, 4)) and words["lr"] == Range(1e-4, 1e-2)
    assert parse_words([str(tmp_path / "s.toml"), "heads=8"])["heads"] == Choices((8,))  # later words win


def test_knob_words_map_to_the_model_settings():
    assert model_overrides({"window": "none", "kv_heads": "heads", "heads": 2, "head_dim": 16}) == {
        "window": None, "num_kv_heads": None, "num_heads": 2, "head_dim": 16, "embed_dim": 32}


@pytest.mark.parametrize("words, message", [
    (["hedas=1,2"], "space='hedas=1,2': unknown knob 'hedas'; the knobs are heads, kv_heads"),
    (["heads="], "space='heads=': heads has no values; give at least one"),
    (["lr=1e-2..1e-4"], "space='lr=0.01..0.0001': an empty range (low must be below high); e.g. lr=0.0001..0.01"),
    (["lr=1e-3..1e-3"], "an empty range (low must be below high); give two different ends"),
    (["heads=1..8"], "space='heads=1..8': heads takes a list of values, not a range"),
    (["heads=two"], "space='heads=two': 'two' is not an int."),
    (["positions=rotary"], "space='positions=rotary': 'rotary' is not one of rope, alibi, sinusoidal, learned, none."),
    (["dropout=1.5"], "space='dropout=1.5': dropout must be in [0, 1)."),
    (["heads"], "space='heads': expected knob=values"),
])
def test_a_bad_entry_is_one_line_naming_it(words, message):
    with pytest.raises(AttnkitValueError) as err:
        parse_words(words)
    assert message in str(err.value)


def test_a_toml_file_that_is_not_toml_is_named(tmp_path):
    (tmp_path / "bad.toml").write_text("heads = [1, 2\n")
    with pytest.raises(AttnkitValueError, match=r"space='.*bad.toml': not valid TOML"):
        read_toml(tmp_path / "bad.toml")
    with pytest.raises(AttnkitValueError, match=r"space='.*nope.toml': cannot read the file"):
        read_toml(tmp_path / "nope.toml")


def test_a_space_no_preset_can_build_is_refused_before_anything_runs():
    fixed = {"width": 128, "positions": "rope"}
    with pytest.raises(AttnkitValueError, match=r"space='heads=3': no combination with the other knobs builds a model "
                                                r"\(e.g. heads=3 width=128 positions=rope: embed_dim=128 must be "
                                                r"divisible by num_heads=3.*remove 3 from heads"):
        check_buildable(parse_words(["heads=2,3"]), "tiny", fixed)
    with pytest.raises(AttnkitValueError, match=r"no model of the 'tiny' preset can be built from this space"):
        check_buildable(parse_words(["heads=3,5"]), "tiny", fixed)
    with pytest.raises(AttnkitValueError, match="width and head_dim both given"):
        check_buildable(parse_words(["width=64", "head_dim=16"]), "tiny", fixed)
    check_buildable(parse_words(["heads=1,2,4,8", "kv_heads=heads,1", "width=64,128"]), "tiny", fixed)  # all build


def test_a_combination_that_does_not_build_says_why_and_the_rest_do():
    assert "must be a multiple of num_kv_heads=4" in build_problem("tiny", {"heads": 2, "kv_heads": 4})
    assert "head_dim must be even for RoPE" in build_problem("tiny", {"heads": 2, "width": 66, "positions": "rope"})
    assert build_problem("tiny", {"heads": 2, "width": 66, "positions": "alibi"}) is None
    assert "learned positions have 256 rows" in build_problem("tiny", {"positions": "learned"}, seq_len=512)


def test_every_default_space_builds_and_every_knob_of_it_is_drawn():
    import optuna

    for preset in ("nano", "tiny", "small"):
        space = default_space(preset)
        check_buildable(space, preset, {})
    trial = optuna.create_study().ask()
    values = suggest(trial, default_space("tiny"))
    assert set(values) == set(default_space("tiny")) and 1e-3 <= values["lr"] <= 4e-3


@pytest.mark.parametrize("extra, message", [
    (["--space", "hedas=1,2"], "attnkit sweep: error: --space 'hedas=1,2': unknown knob 'hedas'"),
    (["--space", "lr=1e-2..1e-4"], "attnkit sweep: error: --space 'lr=0.01..0.0001': an empty range"),
    (["--space", "heads=3,5"], "attnkit sweep: error: --space 'heads=3,5': no model of the 'tiny' preset can be built"),
    (["--space", "heads=1", "--storage", "postgresql://nobody@127.0.0.1:9/none"],
     "attnkit sweep: error: --storage 'postgresql://nobody@127.0.0.1:9/none' cannot be reached"),
    (["--space", "heads=1", "--storage", "mysql://x@y/z"],
     "attnkit sweep: error: --storage 'mysql://x@y/z' is not a database URL attnkit can share between workers"),
    (["--trials", "1"], "attnkit sweep: error: --trials 1 leaves no trial beside the baseline"),
    (["--workers", "999"], "attnkit sweep: error: --workers 999 is more than this machine's"),
])
def test_bad_input_is_one_line_naming_the_flag(tmp_path, capsys, extra, message):
    steps = [] if "--minutes" in extra else ["--trial-steps", "2"]
    assert main(["sweep", "--run-dir", str(tmp_path / "s"), *steps, *extra]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(message), err
    assert not (tmp_path / "s").exists() or "cannot be reached" in message  # refused before anything is trained


def test_minutes_too_short_for_the_plan_is_refused_before_calibrating(tmp_path, capsys):
    assert main(["sweep", "--run-dir", str(tmp_path / "s"), "--minutes", "0.5", "--space", "heads=1,2"]) == 2
    assert re.search(r"--minutes 0.5 leaves [0-9.]+ s for each of 12 trials and 6 verdict re-runs", capsys.readouterr().err)
    assert not (tmp_path / "s" / "calibration").exists()


def test_minutes_and_trial_steps_exclude_each_other():
    with pytest.raises(AttnkitValueError, match=r"give either minutes= .* or trial_steps= .*not both"):
        SweepConfig(minutes=1, trial_steps=3)
    with pytest.raises(AttnkitValueError, match="not neither"):
        SweepConfig()
    with pytest.raises(AttnkitValueError, match=r"seeds must be >= 0, got -1"):
        SweepConfig(trial_steps=2, seeds=-1)
    with pytest.raises(AttnkitValueError, match=r"grid=True needs lists of values"):
        SweepConfig(trial_steps=2, grid=True, space={"lr": "1e-3..1e-2"})


def test_a_missing_driver_names_the_install(monkeypatch):
    import builtins

    from attnkit.sweep.storage import check_url

    real = builtins.__import__
    monkeypatch.setattr(builtins, "__import__", lambda name, *a, **k: (_ for _ in ()).throw(ImportError(name))
                        if name == "psycopg" else real(name, *a, **k))
    with pytest.raises(EnvironmentUnsupportedError, match=r"needs the database driver 'psycopg'.*attnkit\[postgres\]"):
        check_url("postgresql://u:secret@h/db")
    try:
        check_url("postgresql://u:secret@h/db")
    except EnvironmentUnsupportedError as exc:
        assert "secret" not in str(exc)  # the password never reaches a message


def test_a_grid_plans_exactly_its_combinations_and_the_baseline():
    """The regression: a grid's time budget was split as for the default 12 trials, not for the grid's own."""
    config = SweepConfig(minutes=3, grid=True, space={"heads": [16], "window": [32, 64]})
    assert config.trials == 3
    from attnkit.sweep.config import trial_seconds

    assert trial_seconds(180.0, config) == pytest.approx((180.0 - 15.0) / (3 + 6))
