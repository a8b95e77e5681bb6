"""LMConfig's glossary names (issue 20): ``embed_dim`` (E), ``num_layers``, ``num_heads`` (H), ``num_kv_heads``
(Hkv). Configs, checkpoints and runs written under the old names (dim, n_layers, n_heads, n_kv_heads) still load,
and what attnkit writes uses the new names only. Old-name literals here carry ``rename-lmconfig: skip`` so that
scripts/rename_lmconfig.py leaves them old."""

import json
from dataclasses import fields
from pathlib import Path

import pytest
import torch

from attnkit.models.builders import build_lm, lm_config
from attnkit.models.config import RENAMED_FIELDS, LMConfig
from attnkit.runs import read, write
from attnkit.training.config import TrainConfig

DATA = Path(__file__).parent / "data"
OLD = {"dim": 16, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2}  # rename-lmconfig: skip
NEW = {"embed_dim": 16, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2}


def test_the_renamed_fields_are_the_glossary_names_and_the_old_ones_are_gone():
    names = {f.name for f in fields(LMConfig)}
    assert set(RENAMED_FIELDS.values()) <= names and not set(RENAMED_FIELDS) & names


def test_an_old_format_dict_loads_as_the_new_names_and_writes_only_new_names():
    config = LMConfig.from_dict({**OLD, "vocab_size": 50})
    assert config == LMConfig(vocab_size=50, **NEW)
    written = config.to_dict()
    assert not set(RENAMED_FIELDS) & set(written) and LMConfig.from_dict(written) == config


@pytest.mark.parametrize("name", sorted(p.stem for p in DATA.glob("*.json")))
def test_the_old_format_fixtures_load_under_the_new_names(name):
    data = json.loads((DATA / f"{name}.json").read_text())
    assert "dim" in data  # rename-lmconfig: skip  (the fixtures stay in the old format on purpose)
    config = LMConfig.from_dict(data)
    for old, new in RENAMED_FIELDS.items():
        if old in data:
            assert getattr(config, new) == data[old]


def test_a_field_under_both_names_is_refused():
    with pytest.raises(ValueError, match=r"\['n_heads'\] are given under both their old and new names "  # rename-lmconfig: skip
                                         r"\(n_heads -> num_heads\); keep only the new one"):  # rename-lmconfig: skip
        LMConfig.from_dict({"n_heads": 4, "num_heads": 4})  # rename-lmconfig: skip


def test_an_old_keyword_to_build_lm_names_the_new_one():
    with pytest.raises(TypeError, match=r"pass embed_dim=, num_kv_heads= instead of dim=, n_kv_heads="):  # rename-lmconfig: skip
        build_lm("nano", dim=32, n_kv_heads=1)  # rename-lmconfig: skip


def test_a_saved_train_config_with_old_model_names_resumes_under_the_new_ones():
    saved = {"steps": 5, "model": {"n_kv_heads": 1, "positions": "alibi"}}  # rename-lmconfig: skip
    assert TrainConfig.from_dict(saved).model == {"num_kv_heads": 1, "positions": "alibi"}


def test_an_old_format_checkpoint_loads(tmp_path):
    torch.manual_seed(0)
    model = build_lm("nano", num_layers=1, num_kv_heads=1).eval()
    old = {RENAMED_FIELDS_INVERSE.get(k, k): v for k, v in model.config.to_dict().items()}
    assert "n_kv_heads" in old  # rename-lmconfig: skip
    write.save_checkpoint(tmp_path / "run", 1, model, None, {"model_config": old, "run_id": "r1"})
    loaded = read.load_model(tmp_path / "run")
    assert loaded.config == model.config == lm_config("nano", num_layers=1, num_kv_heads=1)
    tokens = torch.randint(0, model.config.vocab_size, (1, 8))
    torch.testing.assert_close(loaded(tokens), model(tokens), rtol=0, atol=0)


RENAMED_FIELDS_INVERSE = {new: old for old, new in RENAMED_FIELDS.items()}
