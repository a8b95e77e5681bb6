"""Checkpoint integrity (issue 16 items 13, 14, 16): the manifest state.json is itself verified (its hash, its
canonical bytes, the fixed file set, the step against the folder name, the run identity), only the checkpoint's
own regular files by fixed names are opened, and killed writes' temporary folders are cleaned on the next start."""

import json
import os
import random
import shutil
import threading

import pytest
import torch
from train_helpers import small_config

from attnkit.models.builders import build_lm
from attnkit.training import checkpoint as ckpt
from attnkit.training.loop import load_model, train
from attnkit.training.metrics import read_metrics


def _quiet(*args, **kwargs):
    pass


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    torch.set_num_threads(1)
    run_dir = tmp_path_factory.mktemp("integrity") / "run"
    train(small_config(run_dir, steps=8, ckpt_every=4, keep=2), log=_quiet)
    return run_dir


def _copy(run, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns(".attnkit.lock"))
    return dst


def test_random_bit_flips_in_the_manifest_are_all_rejected(run, tmp_path):
    """168 of 300 random flips were accepted before the manifest carried its own hash."""
    copy = _copy(run, tmp_path)
    newest = ckpt.resolve(copy)
    original = (newest / "state.json").read_bytes()
    rng = random.Random(0)
    accepted = []
    for _ in range(300):
        data = bytearray(original)
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        (newest / "state.json").write_bytes(bytes(data))
        try:
            ckpt.read_state(newest)
            accepted.append(bit)
        except ckpt.CheckpointError:
            pass
    assert accepted == [], f"{len(accepted)} of 300 bit flips were accepted (bits {accepted[:10]})"
    (newest / "state.json").write_bytes(original)
    assert ckpt.read_state(newest)["step"] == 8  # the undamaged manifest still verifies


def _rewrite(path, change):
    """Edit a manifest and re-seal it with a valid own hash: only the semantic checks can catch it."""
    state = json.loads((path / "state.json").read_text())
    change(state)
    (path / "state.json").write_bytes(ckpt.manifest_bytes(state))


@pytest.mark.parametrize(("change", "match"), [
    (lambda s: s.update(sha256={}), r"must record the SHA-256 of exactly \['model.safetensors', 'optim.safetensors'\]"),
    (lambda s: s["sha256"].pop("optim.safetensors"), "must record the SHA-256 of exactly"),
    (lambda s: s["sha256"].update({"/etc/hostname": "0" * 64}), "must record the SHA-256 of exactly"),
    (lambda s: s.update(step=4), "records step 4 but the folder is step_00000008"),
    (lambda s: s.update(run_id="someone-else"), "belongs to another run"),
])
def test_resealed_manifests_with_bad_content_are_rejected(run, tmp_path, change, match):
    copy = _copy(run, tmp_path)
    newest = ckpt.resolve(copy)
    _rewrite(newest, change)
    with pytest.raises(ckpt.CheckpointError, match=match):
        ckpt.read_state(newest)


def test_edited_step_without_resealing_is_rejected(run, tmp_path):
    copy = _copy(run, tmp_path)
    newest = ckpt.resolve(copy)
    text = (newest / "state.json").read_text().replace('"step": 8', '"step": 4')
    (newest / "state.json").write_text(text)
    with pytest.raises(ckpt.CheckpointError, match="do not match its own manifest_sha256"):
        load_model(copy)


def test_a_foreign_runs_checkpoint_is_not_adopted(run, tmp_path):
    other = tmp_path / "other"
    train(small_config(other, steps=12, ckpt_every=12), log=_quiet)
    copy = _copy(run, tmp_path)
    shutil.copytree(ckpt.resolve(other), copy / "checkpoints" / "step_00000012")
    with pytest.raises(ckpt.CheckpointError, match=r"belongs to another run \(run_id '[0-9a-f]{32}', this run folder "
                                                   r"is '[0-9a-f]{32}'\).*--init-from"):
        load_model(copy)
    with pytest.raises(ckpt.CheckpointError, match="belongs to another run"):
        train(small_config(copy), resume=copy, log=_quiet)


def test_only_the_checkpoints_own_regular_files_are_opened(run, tmp_path, monkeypatch):
    """A manifest naming /etc/hostname was read and hashed, /dev/zero hung generate forever."""
    copy = _copy(run, tmp_path)
    newest = ckpt.resolve(copy)
    _rewrite(newest, lambda s: s["sha256"].update({"/dev/zero": "0" * 64}))
    opened = []
    real_open = os.open

    def spy(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    done = []
    worker = threading.Thread(target=lambda: done.append(pytest.raises(ckpt.CheckpointError, ckpt.read_state, newest)))
    worker.start()
    worker.join(timeout=60)
    assert done, "read_state did not return (a device was read)"
    assert all(p.startswith(str(newest)) for p in opened), opened
    monkeypatch.undo()
    # a symlink or a device under a fixed name is refused too
    copy2 = _copy(run, tmp_path / "b")
    newest2 = ckpt.resolve(copy2)
    (newest2 / "model.safetensors").unlink()
    (newest2 / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(ckpt.CheckpointError, match="model.safetensors is not a regular file"):
        ckpt.read_state(newest2)
    (newest2 / "state.json").unlink()
    (newest2 / "state.json").symlink_to("/dev/zero")
    with pytest.raises(ckpt.CheckpointError, match="state.json is not a regular file"):
        ckpt.read_state(newest2)


def test_folder_names_must_be_steps(run, tmp_path):
    copy = _copy(run, tmp_path)
    moved = copy / "best"
    shutil.copytree(ckpt.resolve(copy), moved)
    with pytest.raises(ckpt.CheckpointError, match="'best' is not a checkpoint folder|is not a checkpoint folder"):
        ckpt.read_state(moved)


def test_killed_writes_temporary_folders_are_cleaned_on_the_next_start(run, tmp_path):
    copy = _copy(run, tmp_path)
    leftover = copy / "checkpoints" / ".tmp-step_00000012-x1y2"
    leftover.mkdir()
    (leftover / "model.safetensors").write_bytes(b"partial")
    logs = []
    train(small_config(copy, steps=10), resume=copy, given={"steps"}, log=logs.append)
    assert not leftover.exists()
    assert any("removed 1 unfinished checkpoint write" in line for line in logs), logs


def test_a_cut_metrics_history_is_noticed_on_resume(run, tmp_path):
    copy = _copy(run, tmp_path)
    lines = (copy / "metrics.jsonl").read_text().splitlines(keepends=True)
    assert len(lines) == 8
    (copy / "metrics.jsonl").write_text("".join(lines[:2]))
    logs = []
    train(small_config(copy, steps=10), resume=copy, given={"steps"}, log=logs.append)
    warning = [line for line in logs if "metrics.jsonl" in line and "WARNING" in line]
    assert warning and "has 2 records up to this checkpoint, the checkpoint recorded 8: 6 were lost" in warning[0], logs
    assert [r["step"] for r in read_metrics(copy / "metrics.jsonl")] == [1, 2, 9, 10]


def test_an_intact_history_resumes_without_a_warning(run, tmp_path):
    copy = _copy(run, tmp_path)
    logs = []
    train(small_config(copy, steps=10), resume=copy, given={"steps"}, log=logs.append)
    assert not [line for line in logs if "WARNING" in line], logs
    assert [r["step"] for r in read_metrics(copy / "metrics.jsonl")] == list(range(1, 11))


def test_manifest_round_trip_is_canonical(tmp_path):
    model = build_lm("nano", n_layers=1)
    path = ckpt.save_checkpoint(tmp_path, 3, model, None, {"betas": (0.9, 0.95), "loss": float("nan")})
    state = ckpt.read_state(path)
    assert state["betas"] == [0.9, 0.95] and state["step"] == 3
