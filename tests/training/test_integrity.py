"""Checkpoint integrity (issue 16 items 13, 14, 16): the manifest state.json is itself verified (its hash, its
canonical bytes, the fixed file set, the step against the folder name, the run identity), only the checkpoint's
own regular files by fixed names are opened, and killed writes' temporary folders are cleaned on the next start."""

import json
import os
import random
import shutil
import threading
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import small_config

from attnkit.models.builders import build_lm
from attnkit.runs import read as reader
from attnkit.runs import write as ckpt
from attnkit.training import load_model, train
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
    newest = reader.resolve(copy)
    original = (newest / "state.json").read_bytes()
    rng = random.Random(0)
    accepted = []
    for _ in range(300):
        data = bytearray(original)
        bit = rng.randrange(len(data) * 8)
        data[bit // 8] ^= 1 << (bit % 8)
        (newest / "state.json").write_bytes(bytes(data))
        try:
            reader.read_state(newest)
            accepted.append(bit)
        except reader.CheckpointError:
            pass
    assert accepted == [], f"{len(accepted)} of 300 bit flips were accepted (bits {accepted[:10]})"
    (newest / "state.json").write_bytes(original)
    assert reader.read_state(newest)["step"] == 8  # the undamaged manifest still verifies


def _rewrite(path, change):
    """Edit a manifest and re-seal it with a valid own hash: only the semantic checks can catch it."""
    state = json.loads((path / "state.json").read_text())
    change(state)
    (path / "state.json").write_bytes(reader.manifest_bytes(state))


@pytest.mark.parametrize(("change", "match"), [
    (lambda s: s.update(sha256={}), r"must record the SHA-256 of exactly \['model.safetensors', 'optim.safetensors'\]"),
    (lambda s: s["sha256"].pop("optim.safetensors"), "must record the SHA-256 of exactly"),
    (lambda s: s["sha256"].update({"/etc/hostname": "0" * 64}), "must record the SHA-256 of exactly"),
    (lambda s: s.update(step=4), "records step 4 but the folder is step_00000008"),
    (lambda s: s.update(run_id="someone-else"), "belongs to another run"),
])
def test_resealed_manifests_with_bad_content_are_rejected(run, tmp_path, change, match):
    copy = _copy(run, tmp_path)
    newest = reader.resolve(copy)
    _rewrite(newest, change)
    with pytest.raises(reader.CheckpointError, match=match):
        reader.read_state(newest)


def test_edited_step_without_resealing_is_rejected(run, tmp_path):
    copy = _copy(run, tmp_path)
    newest = reader.resolve(copy)
    text = (newest / "state.json").read_text().replace('"step": 8', '"step": 4')
    (newest / "state.json").write_text(text)
    with pytest.raises(reader.CheckpointError, match="do not match its own manifest_sha256"):
        load_model(copy)


def test_a_foreign_runs_checkpoint_is_not_adopted(run, tmp_path):
    other = tmp_path / "other"
    train(small_config(other, steps=12, ckpt_every=12), log=_quiet)
    copy = _copy(run, tmp_path)
    shutil.copytree(reader.resolve(other), copy / "checkpoints" / "step_00000012")
    with pytest.raises(reader.CheckpointError, match=r"belongs to another run \(run_id '[0-9a-f]{32}', this run folder "
                                                   r"is '[0-9a-f]{32}'\).*init_from="):
        load_model(copy)
    with pytest.raises(reader.CheckpointError, match="belongs to another run"):
        train(small_config(copy), resume=copy, log=_quiet)


def test_only_the_checkpoints_own_regular_files_are_opened(run, tmp_path, monkeypatch):
    """A manifest naming /etc/hostname was read and hashed, /dev/zero hung generate forever."""
    copy = _copy(run, tmp_path)
    newest = reader.resolve(copy)
    _rewrite(newest, lambda s: s["sha256"].update({"/dev/zero": "0" * 64}))
    opened = []
    real_open = os.open

    def spy(path, *args, **kwargs):
        opened.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    done = []
    worker = threading.Thread(target=lambda: done.append(pytest.raises(reader.CheckpointError, reader.read_state, newest)))
    worker.start()
    worker.join(timeout=60)
    assert done, "read_state did not return (a device was read)"
    assert all(p.startswith(str(newest)) for p in opened), opened
    monkeypatch.undo()
    # a symlink or a device under a fixed name is refused too
    copy2 = _copy(run, tmp_path / "b")
    newest2 = reader.resolve(copy2)
    (newest2 / "model.safetensors").unlink()
    (newest2 / "model.safetensors").symlink_to("/dev/zero")
    with pytest.raises(reader.CheckpointError, match="model.safetensors is not a regular file"):
        reader.read_state(newest2)
    (newest2 / "state.json").unlink()
    (newest2 / "state.json").symlink_to("/dev/zero")
    with pytest.raises(reader.CheckpointError, match="state.json is not a regular file"):
        reader.read_state(newest2)


def test_folder_names_must_be_steps(run, tmp_path):
    copy = _copy(run, tmp_path)
    moved = copy / "best"
    shutil.copytree(reader.resolve(copy), moved)
    with pytest.raises(reader.CheckpointError, match="'best' is not a checkpoint folder|is not a checkpoint folder"):
        reader.read_state(moved)


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
    model = build_lm("nano", num_layers=1)
    path = ckpt.save_checkpoint(tmp_path, 3, model, None, {"betas": (0.9, 0.95), "loss": float("nan")})
    state = reader.read_state(path)
    assert state["betas"] == [0.9, 0.95] and state["step"] == 3


# ------------------------------------------------------------------------------------------ red team 2 (identity, TOCTOU)

def test_without_config_json_a_foreign_checkpoint_is_still_not_adopted(run, tmp_path):
    """The run-identity check was skipped when config.json was missing or a symlink."""
    other = tmp_path / "other"
    train(small_config(other, steps=12, ckpt_every=12, seed=1), log=_quiet)
    copy = _copy(run, tmp_path)
    shutil.copytree(reader.resolve(other), copy / "checkpoints" / "step_00000012")
    config = (copy / "config.json").read_bytes()
    (copy / "config.json").unlink()
    with pytest.raises(reader.CheckpointError, match=r"has no readable config.json and its checkpoints belong to "
                                                   r"different runs \(this one '[0-9a-f]{32}', step_00000004 "
                                                   r"'[0-9a-f]{32}', step_00000008 '[0-9a-f]{32}'\).*init_from="):
        load_model(copy)
    with pytest.raises(reader.CheckpointError, match="belong to different runs"):
        train(small_config(copy, steps=14), resume=copy, given={"steps"}, log=_quiet)
    (tmp_path / "elsewhere.json").write_bytes(config)
    (copy / "config.json").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(reader.CheckpointError, match=r"config.json is a symlink, so the run's identity cannot be "
                                                   "trusted"):
        load_model(copy)


def test_a_resume_writes_a_missing_config_json_back(run, tmp_path):
    copy = _copy(run, tmp_path)
    run_id = reader.run_identity(copy)
    (copy / "config.json").unlink()
    assert load_model(copy) is not None  # one run's checkpoints only: still readable (a converted run has none)
    logs = []
    train(small_config(copy, steps=9), resume=copy, given={"steps"}, log=logs.append)
    assert reader.run_identity(copy) == run_id
    assert any("config.json was missing: written again from the checkpoint" in line for line in logs), logs


def _swap_after_verification(monkeypatch, ckpt_dir, other_dir):
    """Replace both tensor files by another run's (regular files) the moment the last hashed read closes: a
    loader that opens them again by path reads the unverified ones."""
    from attnkit.runs import read as io

    real_open = io.open_regular

    class Swapping:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self.f.__enter__()

        def __exit__(self, *exc):
            result = self.f.__exit__(*exc)
            for name in reader.FILES:
                shutil.copyfile(other_dir / name, ckpt_dir / f"{name}.new")
                os.replace(ckpt_dir / f"{name}.new", ckpt_dir / name)
            return result

    def opening(path):
        f = real_open(path)
        return Swapping(f) if Path(path) == ckpt_dir / "optim.safetensors" else f

    monkeypatch.setattr(io, "open_regular", opening)


@pytest.mark.parametrize("loader", ["load_model", "load_checkpoint"])
def test_the_bytes_loaded_are_the_bytes_verified(run, tmp_path, monkeypatch, loader):
    other = tmp_path / "other"
    train(small_config(other, steps=8, ckpt_every=8, seed=3), log=_quiet)
    copy = _copy(run, tmp_path)
    where = reader.resolve(copy)
    genuine = load_file(str(where / "model.safetensors"))
    genuine_optim = load_file(str(where / "optim.safetensors"))
    _swap_after_verification(monkeypatch, where, reader.resolve(other))
    if loader == "load_model":
        model = load_model(copy)
        assert torch.equal(model.embed.weight, genuine["embed.weight"]), "a file swapped in after the check was loaded"
    else:
        model = build_lm("nano", vocab_size=257)
        _, tensors = ckpt.load_checkpoint(where, model, None, restore_rng=False)
        assert torch.equal(model.embed.weight, genuine["embed.weight"]), "a file swapped in after the check was loaded"
        assert all(torch.equal(tensors[k], genuine_optim[k]) for k in genuine_optim), "optim file read twice"
    assert not torch.equal(load_file(str(where / "model.safetensors"))["embed.weight"], genuine["embed.weight"])
