"""Run folders and training flags (issue 16 items 9, 12, 15, 17, 18, 23, 25): nothing of an old run is lost
before the new one has a checkpoint, one run per folder, no folder silently taken over, resume says what it
ignores and can extend a run, --init-from fine-tunes, changed data is noticed, mistakes are typed errors (exit 2
on the command line), a NaN loss never reaches a checkpoint."""

import json
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from train_helpers import CORPUS, cli_args, run_cli, small_config

from attnkit.cli.main import main
from attnkit.cli.train import flag
from attnkit.errors import AttnkitTypeError, AttnkitValueError, EnvironmentUnsupportedError
from attnkit.runs import read as reader
from attnkit.runs import write as ckpt
from attnkit.runs.folder import RunFolder, RunFolderError, RunInUseError
from attnkit.training import TrainConfig, TrainingDiverged, loop, steps, train, verdict
from attnkit.training.metrics import read_metrics


def _quiet(*args, **kwargs):
    pass


# ------------------------------------------------------------------------------------------ flags (item 9)

@pytest.mark.parametrize(("changes", "error", "match"), [
    ({"clip": -1.0}, AttnkitValueError, r"clip must be > 0.0, got -1.0; the maximum gradient norm, e.g. 1.0; pass inf "
                                        r"to turn clipping off"),
    ({"clip": 0.0}, AttnkitValueError, r"clip must be > 0.0, got 0.0"),
    ({"clip": float("nan")}, AttnkitTypeError, r"clip must be a finite number or inf, got nan"),
    ({"weight_decay": -1.0}, AttnkitValueError, r"weight_decay must be >= 0.0, got -1.0; a decay >= 0"),
    ({"seq_len": 0}, AttnkitValueError, r"seq_len must be >= 2, got 0; tokens per row"),
    ({"seq_len": 1}, AttnkitValueError, r"seq_len must be >= 2"),
    ({"seq_len": 2.5}, AttnkitTypeError, r"seq_len must be an int, got"),
    ({"lr": 0.0}, AttnkitValueError, r"lr must be > 0.0, got 0.0; a positive learning rate"),
    ({"lr": float("inf")}, AttnkitTypeError, r"lr must be a finite number, got inf"),
    ({"warmup": -3}, AttnkitValueError, r"warmup must be >= 0, got -3; steps of warmup; 0 = no warmup"),
    ({"keep": 0}, AttnkitValueError, r"keep must be a positive int, got 0"),
    ({"min_lr_ratio": 1.5}, AttnkitValueError, r"min_lr_ratio must be in \[0.0, 1.0\], got 1.5; a share of lr"),
    ({"val_fraction": 1.0}, AttnkitValueError, r"val_fraction must be in \(0.0, 1.0\), got 1.0; a share of the data"),
    ({"betas": (0.9, 1.0)}, AttnkitValueError, r"betas\[1\] must be in \[0, 1\), got 1.0"),
    ({"betas": (0.9,)}, AttnkitValueError, r"betas must be two numbers in \[0, 1\)"),
])
def test_flags_that_can_only_be_mistakes_are_typed_errors(changes, error, match):
    with pytest.raises(error, match=match):
        TrainConfig(**changes)


def test_clip_inf_turns_clipping_off():
    assert TrainConfig(clip=math.inf).clip == math.inf


@pytest.mark.parametrize(("flags", "words"), [
    (["--clip", "-1"], "--clip must be"), (["--clip", "0"], "--clip must be"),
    (["--weight-decay", "-1"], "--weight-decay must be"), (["--seq-len", "0"], "--seq-len must be >= 2"),
])
def test_cli_flag_mistakes_exit_2_with_the_message_alone(tmp_path, flags, words):
    out = run_cli(cli_args(tmp_path / "run", "--steps", "2", *flags))
    assert out.returncode == 2, out.stderr
    assert words in out.stderr and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()  # nothing written


def test_device_cuda_without_cuda_is_a_typed_error_and_writes_nothing(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    with pytest.raises(EnvironmentUnsupportedError, match=r"device='cuda': CUDA is not available here .*device='cpu'"):
        train(small_config(tmp_path / "run", device="cuda"), log=_quiet)
    assert not (tmp_path / "run").exists()
    assert main(["train", "--run-dir", str(tmp_path / "cli"), "--device", "cuda", "--steps", "2"]) == 2
    assert not (tmp_path / "cli").exists()
    with pytest.raises(AttnkitValueError, match=r"device must be 'auto', 'cpu', 'cuda' or 'cuda:N' \(or 'mps'\), got 'gpu'"):
        train(small_config(tmp_path / "run", device="gpu"), log=_quiet)


# ------------------------------------------------------------------------------------------ NaN (item 9)

def test_a_nan_loss_stops_the_run_and_the_last_finite_checkpoint_stays_newest(tmp_path, monkeypatch):
    calls = [0]
    real = steps.lm_loss

    def poisoned(model, batch, precision, device):
        calls[0] += 1
        loss = real(model, batch, precision, device)
        return loss * float("nan") if calls[0] == 7 else loss  # step 7's loss (training calls only)

    monkeypatch.setattr(steps, "lm_loss", poisoned)
    with pytest.raises(TrainingDiverged, match=r"training stopped at step 7: the loss is nan .*nothing was saved for "
                                               r"this step, the newest checkpoint .*step_00000006 is the last finite"):
        train(small_config(tmp_path, steps=12, ckpt_every=3, eval_every=100), log=_quiet)
    newest = reader.resolve(tmp_path)
    assert newest.name == "step_00000006"
    weights = load_file(str(newest / "model.safetensors"))
    assert all(torch.isfinite(t).all() for t in weights.values())
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")][-1] == 6


# ------------------------------------------------------------------------------------------ run folders

def test_overwrite_with_a_bad_argument_keeps_the_old_run(tmp_path):
    """item 12: a typo in --data destroyed the previous run before the arguments were checked."""
    run = tmp_path / "run"
    train(small_config(run, steps=4, ckpt_every=4), log=_quiet)
    before = sorted(p.name for p in run.rglob("*"))
    with pytest.raises(AttnkitValueError, match="is neither a file nor a folder"):
        train(small_config(run, steps=4, overwrite=True, data=str(tmp_path / "typo")), log=_quiet)
    assert sorted(p.name for p in run.rglob("*")) == before


def test_overwrite_failing_before_its_first_checkpoint_restores_the_old_run(tmp_path, monkeypatch):
    run = tmp_path / "run"
    train(small_config(run, steps=4, ckpt_every=4), log=_quiet)
    old_config = (run / "config.json").read_text()
    old_weights = (reader.resolve(run) / "model.safetensors").read_bytes()
    monkeypatch.setattr(loop.Trainer, "save", lambda self: (_ for _ in ()).throw(OSError("disk full")))
    with pytest.raises(OSError, match="disk full"):
        train(small_config(run, steps=4, ckpt_every=2, overwrite=True, seed=5), log=_quiet)
    assert (run / "config.json").read_text() == old_config
    assert (reader.resolve(run) / "model.safetensors").read_bytes() == old_weights
    assert not (run / ".replaced").exists()


def test_overwrite_killed_before_its_first_checkpoint_is_undone_on_the_next_start(tmp_path):
    run = tmp_path / "run"
    train(small_config(run, steps=4, ckpt_every=4), log=_quiet)
    old = reader.resolve(run).name
    aside = run / ".replaced"  # what a SIGKILL right after set_aside leaves
    aside.mkdir()
    for name in ("checkpoints", "config.json", "metrics.jsonl"):
        shutil.move(str(run / name), aside / name)
    (run / "config.json").write_text('{"partial": true}')
    RunFolder(run, log=_quiet).acquire().release()
    assert reader.resolve(run).name == old and not aside.exists() and "run_id" in (run / "config.json").read_text()


def test_overwrite_replaces_the_old_run_once_the_new_one_checkpointed(tmp_path):
    run = tmp_path / "run"
    train(small_config(run, steps=8, ckpt_every=4), log=_quiet)
    old_id = reader.run_identity(run)
    train(small_config(run, steps=4, ckpt_every=2, overwrite=True), log=_quiet)
    assert [p.name for p in reader.list_checkpoints(run)] == ["step_00000002", "step_00000004"]
    assert reader.run_identity(run) != old_id and not (run / ".replaced").exists()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]


def test_a_second_run_in_a_folder_still_training_is_refused(tmp_path):
    """item 15: two runs in one folder both exited 0 and mixed their files."""
    run = tmp_path / "run"
    train(small_config(run, steps=4, ckpt_every=4), log=_quiet)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); "
        "fcntl.flock(fd, fcntl.LOCK_EX); os.ftruncate(fd, 0); os.write(fd, b'pid 4242'); "
        "print('locked', flush=True); time.sleep(60)"),
        str(run / ".attnkit.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunInUseError, match=r"is in use by pid 4242 \(it is still training\)"):
            train(small_config(run, steps=8), resume=run, given={"steps"}, log=_quiet)
        with pytest.raises(RunInUseError, match="is in use"):
            train(small_config(run, steps=4, overwrite=True), log=_quiet)
        out = run_cli(cli_args(run, "--resume", str(run), "--steps", "8"))
        assert out.returncode == 2 and "is in use by" in out.stderr and "Traceback" not in out.stderr
    finally:
        holder.kill()
        holder.wait()
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3, 4]  # untouched


def test_a_non_empty_folder_that_is_not_a_run_is_refused_unless_overwrite(tmp_path):
    """item 17: a Hugging Face folder's config.json was silently replaced."""
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "gpt2"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    for overwrite in (False, True):  # issue 21 item 5: never moved, even with --overwrite
        with pytest.raises(RunFolderError, match=r"is not an attnkit run and holds \['config.json'\] \(it holds "
                                                 r"\['config.json', 'model.safetensors'\]: a Hugging Face model folder"):
            train(small_config(folder, steps=2, overwrite=overwrite), log=_quiet)
        assert (folder / "config.json").read_text() == '{"model_type": "gpt2"}'
        assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]
    (folder / "config.json").rename(folder / "notes.json")  # other files only: --overwrite mixes the run in
    with pytest.raises(RunFolderError, match=r"is not empty and is not an attnkit run.*pass overwrite=True"):
        train(small_config(folder, steps=2), log=_quiet)
    train(small_config(folder, steps=2, ckpt_every=2, overwrite=True), log=_quiet)
    assert (folder / "model.safetensors").read_bytes() == b"weights"
    assert reader.run_identity(folder) is not None


# ------------------------------------------------------------------------------------------ resume (item 18)

def test_resume_names_the_flags_it_ignores_and_extends_with_steps(tmp_path):
    run = tmp_path / "run"
    train(small_config(run, steps=6, ckpt_every=3), log=_quiet)
    logs = []
    result = train(small_config(run, steps=10, lr=0.5, batch_size=8), resume=run,
                   given={"steps", "lr", "batch_size"}, log=logs.append)
    text = "\n".join(logs)  # the library names the settings by their fields (the CLI by its flags: names=flag)
    assert "resume keeps the run's own settings; ignored: batch_size 8 (the run has 4), lr 0.5 (the run has 0.003). " \
           "To change them start a new run from this checkpoint's weights with init_from." in text, text
    assert "schedule: 6 -> 10 steps; the learning rate keeps its warmup + cosine to step 6, then holds its minimum" \
        in text, text
    assert result.step == 10
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 11))
    minimum = 3e-3 * TrainConfig().min_lr_ratio
    assert all(r["lr"] == pytest.approx(minimum) for r in records[6:])  # held at the minimum beyond the old end
    with pytest.raises(AttnkitValueError, match="--steps 5 is below the checkpoint's step 10"):
        train(small_config(run, steps=5), resume=run, given={"steps"}, names=flag, log=_quiet)
    logs.clear()
    train(small_config(run), resume=run, names=flag, log=logs.append)
    assert any("already finished at step 10; pass --steps N" in line for line in logs), logs


def test_extending_matches_the_schedule_it_states(tmp_path):
    """An extended run equals a run whose schedule ended at 6 and went on at the minimum: bitwise on CPU."""
    a, b = tmp_path / "a", tmp_path / "b"
    train(small_config(a, steps=6, ckpt_every=3), log=_quiet)
    train(small_config(a, steps=9), resume=a, given={"steps"}, log=_quiet)
    train(small_config(b, steps=6, ckpt_every=3), log=_quiet)
    train(small_config(b, steps=7), resume=b, given={"steps"}, log=_quiet)
    train(small_config(b, steps=9), resume=b, given={"steps"}, log=_quiet)
    la = [r["loss"] for r in read_metrics(a / "metrics.jsonl")]
    lb = [r["loss"] for r in read_metrics(b / "metrics.jsonl")]
    assert la == lb and len(la) == 9


def test_changed_data_is_noticed_on_resume(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(CORPUS, data)
    run = tmp_path / "run"
    train(small_config(run, data=str(data), steps=4, ckpt_every=4), log=_quiet)
    logs = []
    train(small_config(run, steps=4), resume=run, log=logs.append)
    assert not [line for line in logs if "WARNING" in line], logs
    target = sorted(data.glob("*.py"))[0]
    target.write_text(target.read_text() + "\n# changed\n")
    train(small_config(run, steps=4), resume=run, log=logs.append)
    assert any("WARNING: the training data changed since this checkpoint" in line for line in logs), logs
    assert len(json.loads((run / "config.json").read_text())["data_sha256"]) == 64


def test_init_from_starts_a_new_run_from_a_checkpoints_weights(tmp_path):
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    train(small_config(base, steps=6, ckpt_every=6), log=_quiet)
    logs = []
    train(small_config(tuned, steps=2, ckpt_every=2, lr=1e-9, warmup=0, preset="tiny"), init_from=base,
          given={"preset"}, names=flag, log=logs.append)
    assert any("--init-from builds the model of" in line and "ignored --preset" in line for line in logs), logs
    config = json.loads((tuned / "config.json").read_text())
    assert config["init_from"]["step"] == 6 and config["init_from"]["run_id"] == reader.run_identity(base)
    assert config["run_id"] != reader.run_identity(base)
    w0 = load_file(str(reader.resolve(base) / "model.safetensors"))
    w1 = load_file(str(reader.resolve(tuned) / "model.safetensors"))
    assert all(torch.allclose(w0[k], w1[k], atol=1e-6) for k in w0)  # lr 1e-9: the weights it started from
    assert reader.read_state(reader.resolve(tuned))["step"] == 2  # a new run: step counts from 0
    with pytest.raises(AttnkitValueError, match="resume and init_from exclude each other"):
        train(small_config(tuned), resume=tuned, init_from=base, names=flag, log=_quiet)
    with pytest.raises(AttnkitValueError, match="seq_len=512 exceeds max_seq_len=.* of the checkpoint"):
        train(small_config(tmp_path / "long", seq_len=512), init_from=base, names=flag, log=_quiet)


# ------------------------------------------------------------------------------------------ messages (item 25)

def test_warmup_longer_than_the_run_is_stated(tmp_path):
    logs = []
    train(small_config(tmp_path, steps=4, warmup=50, ckpt_every=4), log=logs.append)
    assert any("warmup (50 steps) is not shorter than the run (4 steps)" in line for line in logs), logs


def test_the_summary_says_plainly_whether_the_baseline_was_beaten():
    assert verdict(2.0, 3.5) == ("validation loss 2.000 (perplexity 7.39) beat the unigram baseline 3.500 by 1.500 "
                                 "nats/token")
    assert verdict(3.9, 2.2).startswith("validation loss 3.900 (perplexity 49.40) did NOT beat the unigram baseline "
                                        "2.200: it is 1.700 nats/token worse")


# ------------------------------------------------------------------------------------------ generate (item 23)

def test_generate_errors_name_the_value_and_the_limit(tmp_path, capsys):
    from attnkit.models.builders import build_lm
    from attnkit.models.generation import generate

    model = build_lm("nano", vocab_size=100).eval()
    with pytest.raises(AttnkitValueError, match=r"token id 250, but the model's vocabulary has 100 ids \(0 .. 99\)"):
        generate(model, [[1, 250]], max_new_tokens=2)
    run = tmp_path / "run"
    train(small_config(run, steps=2, ckpt_every=2, model={"positions": "learned"}), log=_quiet)
    limit = json.loads((run / "config.json").read_text())["model"]["max_seq_len"]
    assert main(["generate", "--checkpoint", str(run), "--prompt", "def ", "--max-new-tokens", str(limit),
                 "--cache", "static"]) == 2
    err = capsys.readouterr()
    assert (f"--max-new-tokens {limit} with a prompt of 4 tokens needs {limit + 4} positions, but the model's "
            f"learned positions hold {limit}; pass --max-new-tokens {limit - 4} or less") in err.err
    assert err.out == ""  # refused before any text was printed


def test_a_config_that_does_not_fit_its_weights_is_a_typed_error(tmp_path):
    from attnkit.models.builders import build_lm

    path = ckpt.save_checkpoint(tmp_path, 1, build_lm("nano"), None, {})
    with pytest.raises(reader.CheckpointError, match=r"does not fit the model: blocks.0.attn.out_proj.weight is \(64, 64\) "
                                                     r"in the checkpoint but \(128, 128\) in the model"):
        reader.load_weights(path, build_lm("nano", embed_dim=128))


# ------------------------------------------------------------------------------------------ red team 2 (resume, init)

def test_a_fine_tuned_run_resumes_the_model_it_trained(tmp_path):
    """Flags --init-from reported as ignored were written into the run's settings; --resume then rebuilt a different
    model (ALiBi + window 4 on RoPE weights, silently) or failed with a shape error (--preset tiny on nano)."""
    base, tuned = tmp_path / "base", tmp_path / "tuned"
    train(small_config(base, steps=2, ckpt_every=2), log=_quiet)
    logs = []
    train(small_config(tuned, steps=2, ckpt_every=1, keep=10, preset="tiny", model={"positions": "alibi", "window": 4}),
          init_from=base, given={"preset", "model"}, names=flag, log=logs.append)
    text = "\n".join(logs)
    assert ("ignored --preset 'tiny' (the checkpoint's run has 'nano'), --positions 'alibi' (the checkpoint has "
            "'rope'), --window 4 (the checkpoint has None)") in text, text
    assert "model: the checkpoint's own, 2 layers, dim 64, 2 heads, rope positions" in text, text
    recorded = json.loads((tuned / "config.json").read_text())["train"]
    assert recorded["preset"] == "nano" and recorded["model"]["positions"] == "rope", recorded
    logs.clear()
    train(small_config(tuned, steps=4), resume=tuned, given={"steps"}, names=flag, log=logs.append)
    base_model = reader.read_state(reader.resolve(base))["model_config"]
    for where in reader.list_checkpoints(tuned):
        assert reader.read_state(where)["model_config"] == base_model, where
    assert reader.read_state(reader.resolve(tuned))["step"] == 4


def test_resume_names_an_ignored_run_dir(tmp_path):
    run = tmp_path / "run"
    train(small_config(run, steps=2, ckpt_every=2), log=_quiet)
    logs = []
    train(small_config(tmp_path / "elsewhere", steps=2), resume=run, given={"run_dir"}, names=flag, log=logs.append)
    assert any(f"ignored: --run-dir '{tmp_path / 'elsewhere'}' (the run's folder is '{run}')" in line
               for line in logs), logs
    assert not (tmp_path / "elsewhere").exists()


def test_resume_refuses_a_checkpoint_outside_its_run_folder(tmp_path):
    """A checkpoint kept in home/backups/ made home/ the run folder: rotation deleted home/checkpoints/, loss.png
    was overwritten."""
    run, home = tmp_path / "run", tmp_path / "home"
    train(small_config(run, steps=4, ckpt_every=2), log=_quiet)
    (home / "checkpoints" / "step_00000001").mkdir(parents=True)
    (home / "checkpoints" / "step_00000001" / "notes.txt").write_text("my notes")
    (home / "loss.png").write_text("my own picture")
    shutil.copytree(reader.resolve(run), home / "backups" / "step_00000004")
    with pytest.raises(reader.CheckpointError, match=r"is not a checkpoint inside a run folder \(RUN/checkpoints/"
                                                   r"step_NNNNNNNN, a folder, not a link\).*--init-from .*step_00000004 "
                                                   r"--run-dir NEW"):
        train(small_config(run, steps=8), resume=home / "backups" / "step_00000004", given={"steps"}, names=flag, log=_quiet)
    assert (home / "checkpoints" / "step_00000001" / "notes.txt").read_text() == "my notes"
    assert (home / "loss.png").read_text() == "my own picture" and not (home / ".attnkit.lock").exists()
    link = run / "checkpoints" / "step_00000009"
    link.symlink_to(reader.resolve(run))
    with pytest.raises(reader.CheckpointError, match="is not a checkpoint inside a run folder"):
        train(small_config(run, steps=12), resume=link, given={"steps"}, names=flag, log=_quiet)


def test_a_converted_checkpoint_is_not_resumed(tmp_path):
    from attnkit.models.builders import build_lm

    where = ckpt.save_checkpoint(tmp_path / "conv", 0, build_lm("nano"), None, {"model_config": build_lm("nano")
                                                                              .config.to_dict()}, keep=0)
    with pytest.raises(reader.CheckpointError, match=r"was not written by the trainer \(a converted model has no "
                                                   r"training state to continue\).*--init-from"):
        train(small_config(tmp_path / "conv"), resume=where, names=flag, log=_quiet)


def test_a_symlinked_lock_file_is_refused_and_its_target_kept(tmp_path):
    """Taking the lock truncated the symlink's target and wrote the pid into it."""
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    train(small_config(run, steps=2, ckpt_every=2), log=_quiet)
    victim.write_text("precious user data")
    (run / ".attnkit.lock").unlink()
    (run / ".attnkit.lock").symlink_to(victim)
    with pytest.raises(RunFolderError, match=r"\.attnkit\.lock' is not a regular file \(a symlink\); attnkit will not "
                                             r"write through it.*remove it and run again"):
        train(small_config(run, steps=3), resume=run, given={"steps"}, log=_quiet)
    assert victim.read_text() == "precious user data"
    (run / ".attnkit.lock").unlink()
    os.mkfifo(run / ".attnkit.lock")
    with pytest.raises(RunFolderError, match=r"is not a regular file \(a FIFO or a device\)"):
        RunFolder(run, log=_quiet).acquire()


def test_run_outputs_replace_a_symlink_instead_of_writing_through_it(tmp_path, monkeypatch):
    """A symlinked loss.png (or config.json) was written through: the PNG landed on the link's target."""
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    train(small_config(run, steps=2, ckpt_every=2), log=_quiet)
    victim.write_text("precious user data")
    (run / "loss.png").unlink()
    (run / "loss.png").symlink_to(victim)
    train(small_config(run, steps=3), resume=run, given={"steps"}, log=_quiet)
    assert victim.read_text() == "precious user data"
    assert not (run / "loss.png").is_symlink() and (run / "loss.png").read_bytes()[:4] == b"\x89PNG"
    real_set_aside = RunFolder.set_aside

    def then_a_link(self):  # a link planted once the old outputs are aside, before the new run writes config.json
        real_set_aside(self)
        (self.path / "config.json").symlink_to(victim)

    monkeypatch.setattr(RunFolder, "set_aside", then_a_link)
    train(small_config(run, steps=2, ckpt_every=2, overwrite=True), log=_quiet)
    assert victim.read_text() == "precious user data"
    assert not (run / "config.json").is_symlink()
    assert json.loads((run / "config.json").read_text())["run_id"] == reader.run_identity(run) is not None
    assert not [p for p in run.iterdir() if ".tmp-" in p.name]


def test_a_kill_inside_set_aside_loses_none_of_the_old_run(tmp_path):
    """A kill between set_aside's moves (checkpoints moved, the rest not): the next start deleted config.json,
    metrics.jsonl and loss.png and restored only the checkpoints."""
    run = tmp_path / "run"
    train(small_config(run, steps=4, ckpt_every=2), log=_quiet)
    before = {n: (run / n).read_bytes() for n in ("config.json", "metrics.jsonl", "loss.png")}
    (run / ".replaced").mkdir()
    os.replace(run / "checkpoints", run / ".replaced" / "checkpoints")
    RunFolder(run, log=_quiet).acquire().release()
    assert {n: (run / n).read_bytes() for n in before} == before
    assert reader.resolve(run).name == "step_00000004" and not (run / ".replaced").exists()


def test_a_killed_overwrite_of_a_converted_run_removes_the_new_runs_files(tmp_path, monkeypatch):
    """The old run had no config.json: the new run's, written before its kill, must not stay next to the restored
    checkpoint (whose run it is not)."""
    from attnkit.models.builders import build_lm

    run = tmp_path / "run"
    model = build_lm("nano")
    ckpt.save_checkpoint(run, 0, model, None, {"model_config": model.config.to_dict()}, keep=0)
    folder = RunFolder(run, log=_quiet).acquire()
    folder.set_aside()
    assert json.loads((run / ".replaced" / ".moving.json").read_text()) == ["checkpoints"]
    (run / "config.json").write_text('{"run_id": "new"}')  # the new run's, then a SIGKILL: no abandon()
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    folder.release()
    RunFolder(run, log=_quiet).acquire().release()
    assert sorted(p.name for p in run.iterdir()) == [".attnkit.lock", "checkpoints"]
    assert reader.read_state(reader.resolve(run))["step"] == 0


def test_generate_on_something_that_is_not_a_run_lists_the_runs_it_can_see(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["generate", "--checkpoint", "notes.txt", "--prompt", "a"]) == 2
    assert "No run folder in runs/ or in '.'" in capsys.readouterr().err
    train(small_config(tmp_path / "runs" / "first", steps=1), log=lambda *a: None)
    (tmp_path / "runs" / "not-a-run").mkdir()
    assert main(["generate", "--checkpoint", "notes.txt", "--prompt", "a"]) == 2
    assert "Runs here: runs/first." in capsys.readouterr().err


def test_everything_a_run_writes_has_one_permission_mode_from_the_umask(tmp_path):
    """issue 23 item 5: checkpoint folders were 0700 (mkdtemp) and their weights 0600 beside a 0755 run folder;
    now every folder and file a run writes has what mkdir / open give under the umask."""
    for mask in (0o022, 0o077):
        old = os.umask(mask)
        try:
            run = tmp_path / f"run-{mask:o}"
            train(small_config(run, steps=2, ckpt_every=1), log=_quiet)
        finally:
            os.umask(old)
        modes = {str(p.relative_to(run)): p.stat().st_mode & 0o777 for p in [run, *run.rglob("*")]}
        want = {name: (0o777 if (run / name).is_dir() else 0o666) & ~mask for name in modes}
        assert modes == want


def test_generate_on_a_damaged_checkpoint_suggests_no_train_flag(tmp_path, capsys):
    """issue 23 item 4: the hint of a damaged checkpoint fits every command (generate has no --resume)."""
    run = tmp_path / "run"
    train(small_config(run, steps=2, ckpt_every=1), log=_quiet)
    newest = reader.list_checkpoints(run)[-1]
    (newest / "model.safetensors").write_bytes(b"damaged")
    assert main(["generate", str(run), "--prompt", "a", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    assert "step_00000001 is intact: pass it instead of the damaged one" in err and "--resume" not in err, err


def test_rows_longer_than_the_preset_with_computed_positions_are_said(tmp_path):
    said = []
    trainer = loop.Trainer(small_config(tmp_path / "run", seq_len=200), log=said.append)
    trainer.close()
    assert any("note: seq_len 200 is 1.56x the 'nano' preset's 128 positions: the model is built for rows of 200 "
               "(rope positions)" in line for line in said), said
