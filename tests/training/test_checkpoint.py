"""Checkpoints: safetensors + JSON round trip (weights, tied weights, optimizer, RNG), atomic writes,
retention, verification with clear errors for corrupt or truncated files, and no pickles."""

import json
import random

import numpy as np
import pytest
import torch

from attnkit.models.builders import build_lm
from attnkit.runs import read as reader
from attnkit.runs import write as ckpt
from attnkit.training import load_model, param_groups


def _trained(steps=2):
    model = build_lm("nano")
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-3)
    for _ in range(steps):
        tokens = torch.randint(0, 257, (2, 9))
        model(tokens).sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_round_trip_restores_weights_tying_optimizer_and_rng(tmp_path, monkeypatch):
    model, opt = _trained()
    torch.manual_seed(5)
    random.seed(5)
    np.random.seed(5)
    ckpt.save_checkpoint(tmp_path, 7, model, opt, {"model_config": model.config.to_dict(), "note": "x"})
    expected = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)

    def no_pickles(*args, **kwargs):
        raise AssertionError("torch.load must not be used")

    monkeypatch.setattr(torch, "load", no_pickles)
    fresh = build_lm("nano")
    fresh_opt = torch.optim.AdamW(param_groups(fresh, 0.1), lr=1e-3)
    state, _ = ckpt.load_checkpoint(reader.resolve(tmp_path), fresh, fresh_opt)
    assert state["step"] == 7 and state["note"] == "x"
    assert torch.equal(torch.rand(3), expected[0]) and (random.random(), np.random.rand()) == expected[1:]
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), fresh.state_dict().values()))
    assert fresh.head.weight is fresh.embed.weight  # still tied
    for p, q in zip(model.parameters(), fresh.parameters()):
        a, b = opt.state[p], fresh_opt.state[q]
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert fresh_opt.param_groups[0]["weight_decay"] == 0.1
    assert load_model(tmp_path).config == model.config


def test_atomic_write_leaves_no_partial_folder_and_keeps_the_newest(tmp_path, monkeypatch):
    model, opt = _trained(1)
    for step in (1, 2, 3):
        ckpt.save_checkpoint(tmp_path, step, model, opt, {}, keep=2)
    assert [p.name for p in reader.list_checkpoints(tmp_path)] == ["step_00000002", "step_00000003"]

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # a kill in the middle of writing

    monkeypatch.setattr(ckpt, "save_file", crash)
    with pytest.raises(KeyboardInterrupt):
        ckpt.save_checkpoint(tmp_path, 4, model, opt, {}, keep=2)
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000002", "step_00000003"] or \
        sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000002", "step_00000003"]
    (tmp_path / "checkpoints" / ".tmp-step_00000005-abc").mkdir()  # what a SIGKILL mid-write leaves
    assert reader.resolve(tmp_path).name == "step_00000003"


@pytest.mark.parametrize(("damage", "match"), [
    (lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:100]),
     "model.safetensors is corrupt or truncated"),
    (lambda d: (d / "optim.safetensors").write_bytes(b"\0" * 64), "optim.safetensors is corrupt or truncated"),
    (lambda d: (d / "state.json").write_text((d / "state.json").read_text()[:50]), "state.json is truncated"),
    (lambda d: (d / "state.json").unlink(), "has no state.json"),
    (lambda d: (d / "model.safetensors").unlink(), "is missing model.safetensors"),
    (lambda d: (d / "state.json").write_text(json.dumps({"format": "other"})), "is not an attnkit-checkpoint-2"),
])
def test_corrupt_checkpoint_gives_a_clear_error_naming_the_previous_one(tmp_path, damage, match):
    model, opt = _trained(1)
    for step in (1, 2):
        ckpt.save_checkpoint(tmp_path, step, model, opt, {"model_config": model.config.to_dict()})
    newest = reader.resolve(tmp_path)
    damage(newest)
    with pytest.raises(reader.CheckpointError, match=match) as info:
        ckpt.load_checkpoint(newest, build_lm("nano"))
    assert "step_00000001 is intact" in str(info.value)
    ckpt.load_checkpoint(reader.list_checkpoints(tmp_path)[0], build_lm("nano"))  # the previous one still loads


def test_errors_for_missing_and_mismatched(tmp_path):
    with pytest.raises(reader.CheckpointError, match="no checkpoint found in"):
        reader.resolve(tmp_path)
    model, opt = _trained(1)
    ckpt.save_checkpoint(tmp_path, 1, model, opt, {})
    with pytest.raises(reader.CheckpointError, match="does not match the model"):
        reader.load_weights(reader.resolve(tmp_path), build_lm("nano", num_layers=1))
    only = build_lm("nano")
    ckpt.save_checkpoint(tmp_path / "b", 1, only, None, {})
    assert reader.read_state(reader.resolve(tmp_path / "b"))["optimizer"] == {}
    with pytest.raises(reader.CheckpointError, match="no earlier checkpoint exists"):
        (reader.resolve(tmp_path / "b") / "state.json").write_text("{")
        reader.read_state(reader.resolve(tmp_path / "b"))
