"""The training loop behind ``attnkit train``: the tutorial's practice, built in.

AdamW with weight-decay groups (matrices decay; norms, biases and nothing else do not), linear warmup + cosine
decay, gradient clipping, gradient accumulation, bf16 autocast where it is faster on this machine (measured at
the start of a run), optional gradient checkpointing per block, validation loss and perplexity, a tqdm bar
(tokens/s, loss, ETA), ``metrics.jsonl``, ``loss.png``, checkpoints that resume bitwise on CPU after a
SIGKILL at any moment, and DistributedDataParallel under torchrun.

>>> from attnkit.training.loop import TrainConfig, train
>>> result = train(TrainConfig(run_dir="runs/try", preset="tiny", steps=200))  # doctest: +SKIP

Shape legend: B rows per micro-batch (this rank), L seq_len, V vocab_size.
"""

from __future__ import annotations

import gc
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from attnkit.errors import AttnkitValueError
from attnkit.models.builders import PRESETS, lm_config
from attnkit.models.lm import TransformerLM
from attnkit.training import checkpoint as ckpt
from attnkit.training import dist
from attnkit.training.data import ByteTokenizer, PackedDataset, load_documents, split_by_file, unigram_loss
from attnkit.training.metrics import MetricsWriter, plot_loss
from attnkit.training.precision import autocast, choose_precision
from attnkit.training.sampling import sample_text
from attnkit.training.schedule import lr_at


@dataclass
class TrainConfig:
    """Every setting of a run (stored in ``config.json`` and in each checkpoint).

    ``batch_size`` rows of ``seq_len`` tokens per micro-batch (global: split over ranks), ``accum``
    micro-batches per optimizer step. ``steps`` optimizer steps, or ``time_budget`` seconds: then the step
    count is set once from a measured step time and stored, so a resumed run follows the same schedule.
    ``precision``: ``"auto"`` (measure fp32 vs bf16 here, keep the faster), ``"fp32"`` or ``"bf16"``.
    """

    run_dir: str = "runs/latest"
    preset: str = "tiny"
    model: dict = field(default_factory=dict)
    data: str | None = None
    val_fraction: float = 0.05
    seq_len: int | None = None
    doc_mask: bool = True
    batch_size: int = 16
    accum: int = 1
    steps: int = 1000
    time_budget: float | None = None
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    precision: str = "auto"
    grad_checkpointing: bool = False
    eval_every: int = 100
    eval_batches: int = 8
    ckpt_every: int = 100
    keep: int = 2
    seed: int = 0
    device: str = "auto"
    overwrite: bool = False
    overfit: bool = False
    overfit_samples: int = 10
    samples: bool = False
    sample_prompt: str = "def "
    sample_tokens: int = 160
    progress: bool = True

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if self.preset not in PRESETS:
            raise AttnkitValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}.")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise AttnkitValueError(f"precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}; use "
                                    "'auto' to measure and pick the faster here (never fp16 on CPU).")
        for name in ("batch_size", "accum", "steps", "eval_every", "eval_batches", "ckpt_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AttnkitValueError(f"{name} must be a positive int, got {value!r}.")
        if self.time_budget is not None and not self.time_budget > 0:
            raise AttnkitValueError(f"time_budget must be > 0 seconds, got {self.time_budget!r}; omit it to train "
                                    "for a fixed number of steps.")

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    train_loss: float
    val_loss: float | None
    unigram_loss: float | None
    precision: str
    overfit_passed: bool | None = None
    samples: dict = field(default_factory=dict)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay for matrices (linear weights, embeddings), none for norms and biases; tied weights once."""
    decay, no_decay = [], []
    for p in model.parameters():  # parameters() yields each shared tensor once
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def lm_loss(model, batch, precision: str, device: torch.device) -> torch.Tensor:
    """Mean next-token cross-entropy of a batch (logits upcast to fp32 for the loss)."""
    with autocast(precision, device):
        logits = model(batch.inputs, positions=batch.positions, doc_ids=batch.doc_ids)  # (B, L, V)
    return F.cross_entropy(logits.float().flatten(0, 1), batch.targets.flatten())


@torch.no_grad()
def evaluate(model, batches, precision: str, device: torch.device) -> float:
    """Mean validation loss over fixed batches (token-weighted)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for batch in batches:
        batch = batch.to(device)
        total += float(lm_loss(model, batch, precision, device)) * batch.targets.numel()
        count += batch.targets.numel()
    model.train(was_training)
    return total / max(count, 1)


class Trainer:
    """One run: data, model, optimizer, schedule and outputs; :meth:`run` trains to the last step."""

    def __init__(self, config: TrainConfig, *, resume: str | Path | None = None, log=print):
        self.ctx = dist.init(config.device)
        self.log = log if self.ctx.is_main else (lambda *a, **k: None)
        self.resume_state, resume_ckpt = None, None
        if resume is not None:
            resume_ckpt = ckpt.resolve(resume)
            self.resume_state = ckpt.read_state(resume_ckpt)
            config = TrainConfig.from_dict({**self.resume_state["train_config"], "progress": config.progress,
                                            "device": config.device})
            config.run_dir = str(resume_ckpt.parent.parent)
        if config.overfit:  # every step sees all the samples
            config = replace(config, batch_size=config.overfit_samples)
        self.config, self.device = config, self.ctx.device
        dist.check_batch(config.batch_size, self.ctx)
        self.run_dir = Path(config.run_dir)
        if resume is None and ckpt.list_checkpoints(self.run_dir):
            if not config.overwrite:
                raise AttnkitValueError(
                    f"run_dir {str(self.run_dir)!r} already holds checkpoints; continue it with --resume "
                    f"{self.run_dir}, pick another --run-dir, or pass --overwrite to start it afresh.")
            if self.ctx.is_main:
                shutil.rmtree(self.run_dir / "checkpoints")
            dist.barrier(self.ctx)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.tokenizer = ByteTokenizer()
        self._build_data()
        torch.manual_seed(config.seed)
        self.model_config = lm_config(config.preset, **{"vocab_size": self.tokenizer.vocab_size,
                                                        "max_seq_len": max(self.seq_len, PRESETS[config.preset]
                                                                           ["max_seq_len"]), **config.model})
        self.model = TransformerLM(self.model_config).to(self.device)
        self.model.gradient_checkpointing = config.grad_checkpointing
        self.optimizer = torch.optim.AdamW(param_groups(self.model, config.weight_decay), lr=config.lr,
                                           betas=config.betas, fused=False, foreach=True)
        self.step = 0
        if resume_ckpt is not None:
            state, _ = ckpt.load_checkpoint(resume_ckpt, self.model, self.optimizer, rank=self.ctx.rank)
            self.step, self.precision = state["step"], state["precision"]
            self.total_steps = state["total_steps"]
            self.log(f"resumed {resume_ckpt} at step {self.step}/{self.total_steps} ({self.precision})")
        else:
            self.precision, self.total_steps = self._decide_precision_and_steps()
        self.ddp = DistributedDataParallel(self.model) if self.ctx.enabled else None

    # ------------------------------------------------------------------------------------------ set-up
    def _build_data(self) -> None:
        c = self.config
        self.seq_len = c.seq_len or PRESETS[c.preset]["max_seq_len"]
        docs = load_documents(c.data)
        train_docs, val_docs = split_by_file(docs, c.val_fraction)
        self.train_data = PackedDataset(train_docs, self.seq_len, doc_mask=c.doc_mask)
        self.val_data = PackedDataset(val_docs, self.seq_len, doc_mask=c.doc_mask)
        if c.overfit:  # the tutorial's sanity check: the same few rows every step
            self.train_data.num_rows = min(self.train_data.num_rows, c.overfit_samples)
        self.log(f"data: {c.data or 'Python standard library sources'} - {len(train_docs)} train / "
                 f"{len(val_docs)} val documents, {self.train_data.num_tokens:,} / {self.val_data.num_tokens:,} "
                 f"tokens, rows of {self.seq_len}, document mask {'on' if c.doc_mask else 'off'}")

    def _decide_precision_and_steps(self) -> tuple[str, int]:
        c = self.config
        batch = self.train_data.batch(0, c.batch_size, seed=c.seed, rank=self.ctx.rank,
                                      world=self.ctx.world).to(self.device)
        rng = torch.get_rng_state()

        def fwd_bwd(precision: str):
            lm_loss(self.model, batch, precision, self.device).backward()
            self.model.zero_grad(set_to_none=True)

        times: dict[str, float] = {}
        precision = c.precision
        if precision == "auto" or c.time_budget is not None:
            precision, times = choose_precision(fwd_bwd, self.device) if precision == "auto" else (precision, {})
            if times:
                self.log("precision: measured fwd+bwd " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in times.items())
                         + f" -> {precision}")
        steps = c.steps
        if c.time_budget is not None:
            step_time = times.get(precision) or _time_once(fwd_bwd, precision)
            step_time = step_time * c.accum * 1.15  # optimizer step and bookkeeping
            evals = step_time * c.eval_batches / 3  # forward only, every eval_every steps
            steps = max(10, int(c.time_budget / (step_time + evals / c.eval_every)))
            self.log(f"time budget {c.time_budget:.0f} s at ~{step_time:.3f} s/step -> {steps} steps")
        torch.set_rng_state(rng)
        return precision, steps

    # ------------------------------------------------------------------------------------------ run
    def run(self) -> TrainResult:
        """Train to the last step; the process group is released on every exit path (see :meth:`close`)."""
        try:
            return self._run()
        finally:
            self.close()

    def close(self) -> None:
        """Drop the DistributedDataParallel wrapper, then destroy the process group.

        DDP's reducer holds the gloo/nccl group; DDP objects sit in reference cycles, so without an explicit
        collection the group outlives ``destroy_process_group`` until interpreter shutdown, where tearing down
        gloo's worker threads aborts the process ("terminate called without an active exception", SIGABRT)
        in a timing-dependent share of runs.
        """
        if self.ddp is not None:
            self.ddp = None
            gc.collect()
        dist.shutdown(self.ctx)

    def _run(self) -> TrainResult:
        c, ctx = self.config, self.ctx
        eval_batches = list(self.val_data.eval_batches(c.batch_size, c.eval_batches))
        if c.overfit:
            eval_batches = [self.train_data.rows(torch.arange(self.train_data.num_rows))]
        baseline = unigram_loss(self.train_data, eval_batches, self.tokenizer.vocab_size)
        resume_step = self.step if self.resume_state is not None else None
        metrics = MetricsWriter(self.run_dir / "metrics.jsonl", resume_step=resume_step) if ctx.is_main else None
        if ctx.is_main and resume_step is None:
            (self.run_dir / "config.json").write_text(json.dumps(
                {"train": asdict(self.config), "model": self.model_config.to_dict(), "precision": self.precision,
                 "total_steps": self.total_steps, "world": ctx.world}, indent=1))
        n_params = self.model.num_parameters()
        tokens_per_step = c.batch_size * c.accum * self.seq_len
        self.log(f"model: {c.preset} preset, {n_params / 1e6:.2f} M parameters, {self.precision}, "
                 f"{self.total_steps} steps of {tokens_per_step:,} tokens, world {ctx.world}")
        self.log(f"unigram baseline loss: {baseline:.3f} nats/token (perplexity {math.exp(baseline):.1f})")
        samples = {}
        if c.samples and ctx.is_main and resume_step is None:
            samples["before"] = sample_text(self.model, c.sample_prompt, max_new_tokens=c.sample_tokens)
            self.log(f"--- sample before training ---\n{samples['before']}\n---")
        bar = _progress(c.progress and ctx.is_main, self.total_steps, self.step)
        self.model.train()  # (the loop reads self.ddp each time: no local may keep DDP alive, see close())
        loss_value, val_loss, start = float("nan"), None, time.perf_counter()
        tokens_done = 0
        while self.step < self.total_steps:
            self.step += 1
            lr = lr_at(self.step, lr=c.lr, warmup=c.warmup, total=self.total_steps, min_lr_ratio=c.min_lr_ratio)
            if c.overfit:
                lr = c.lr  # no decay: the sanity check needs to reach ~0
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=self.device)
            for micro in range(c.accum):
                batch = self.train_data.batch((self.step - 1) * c.accum + micro, c.batch_size, seed=c.seed,
                                              rank=ctx.rank, world=ctx.world).to(self.device)
                sync_now = self.ddp is None or micro == c.accum - 1
                with _maybe_no_sync(self.ddp, sync_now):
                    loss = lm_loss(self.ddp or self.model, batch, self.precision, self.device) / c.accum
                    loss.backward()
                loss_sum += loss.detach()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss_value = float(dist.mean(loss_sum, ctx))
            tokens_done += tokens_per_step
            elapsed = time.perf_counter() - start
            record = {"step": self.step, "loss": loss_value, "lr": lr, "grad_norm": float(grad_norm),
                      "tokens": self.step * tokens_per_step, "tok_per_s": tokens_done / elapsed}
            if self.step % c.eval_every == 0 or self.step == self.total_steps:
                val_loss = evaluate(self.model, eval_batches, self.precision, self.device)
                record.update(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50.0)))
            if metrics is not None:
                metrics.write(record)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{record['tok_per_s']:,.0f}",
                                **({"val": f"{val_loss:.3f}"} if val_loss is not None else {}))
            if self.step % c.ckpt_every == 0 or self.step == self.total_steps:
                self.save()
        if bar is not None:
            bar.close()
        if metrics is not None:
            metrics.close()
            plot_loss(self.run_dir / "metrics.jsonl", self.run_dir / "loss.png", baseline)
        passed = None
        if c.overfit:
            passed = loss_value < 0.05
            self.log(f"overfit check on {self.train_data.num_rows} samples: final loss {loss_value:.4f} -> "
                     f"{'PASS' if passed else 'FAIL'} (needs < 0.05)")
        if val_loss is not None and not c.overfit:
            verdict = "below" if val_loss < baseline else "NOT below"
            self.log(f"validation loss {val_loss:.3f} (perplexity {math.exp(val_loss):.2f}) vs unigram baseline "
                     f"{baseline:.3f}: {verdict} the baseline by {baseline - val_loss:.3f} nats/token")
        if c.samples and ctx.is_main:
            samples["after"] = sample_text(self.model, c.sample_prompt, max_new_tokens=c.sample_tokens)
            self.log(f"--- sample after training ---\n{samples['after']}\n---")
        self.log(f"run folder: {self.run_dir} (checkpoints/, metrics.jsonl, loss.png, config.json)")
        return TrainResult(self.run_dir, self.step, loss_value, val_loss, baseline, self.precision, passed, samples)

    def save(self) -> None:
        """Checkpoint the current step (rank 0 writes; every rank's RNG state is gathered first)."""
        extra = dist.gather_rng(self.ctx)
        if self.ctx.is_main:
            state = {"total_steps": self.total_steps, "precision": self.precision,
                     "data_position": {"micro_batches": self.step * self.config.accum, "seed": self.config.seed},
                     "schedule": {"kind": "warmup+cosine", "step": self.step},
                     "train_config": asdict(self.config), "model_config": self.model_config.to_dict(),
                     "world": self.ctx.world}
            ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, state, keep=self.config.keep,
                                 extra_tensors=extra)
        dist.barrier(self.ctx)


def train(config: TrainConfig, *, resume: str | Path | None = None, log=print) -> TrainResult:
    """Train (or resume) a run; see :class:`TrainConfig`."""
    return Trainer(config, resume=resume, log=log).run()


def load_model(path: str | Path, device: str | torch.device = "cpu") -> TransformerLM:
    """The model of a checkpoint (a checkpoint folder or a run folder: its newest), verified, in eval mode."""
    where = ckpt.resolve(path)
    state = ckpt.read_state(where)
    from attnkit.models.lm import LMConfig

    model = TransformerLM(LMConfig.from_dict(state["model_config"]))
    ckpt.load_weights(where, model)
    return model.to(device).eval()


def _time_once(fn, precision: str) -> float:
    fn(precision)
    start = time.perf_counter()
    fn(precision)
    return time.perf_counter() - start


def _maybe_no_sync(ddp, sync_now: bool):
    import contextlib

    return contextlib.nullcontext() if sync_now or ddp is None else ddp.no_sync()


def _progress(enabled: bool, total: int, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, smoothing=0.1)
