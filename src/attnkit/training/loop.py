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

import contextlib
import gc
import json
import math
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from attnkit import distributed as cp
from attnkit import masks
from attnkit.errors import AttnkitError, AttnkitValueError
from attnkit.models.builders import PRESETS, lm_config
from attnkit.models.config import LMConfig
from attnkit.models.lm import TransformerLM
from attnkit.runs import write as ckpt
from attnkit.runs.folder import RunFolder
from attnkit.runs.read import METRICS, RUN_CONFIG, LOSS_PLOT, load_model  # noqa: F401  (load_model: re-exported)
from attnkit.runs.write import replacing
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
    context_parallel: int = 1  # ranks sharing each row's sequence (world = data parallel x this)

    def __post_init__(self):
        self.betas = tuple(self.betas)
        if self.preset not in PRESETS:
            raise AttnkitValueError(f"preset must be one of {sorted(PRESETS)}, got {self.preset!r}.")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise AttnkitValueError(f"precision must be 'auto', 'fp32' or 'bf16', got {self.precision!r}; use "
                                    "'auto' to measure and pick the faster here (never fp16 on CPU).")
        for name in ("batch_size", "accum", "steps", "eval_every", "eval_batches", "ckpt_every", "keep",
                     "overfit_samples"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise AttnkitValueError(f"{name} must be a positive int, got {value!r}.")
        if self.seq_len is not None and (isinstance(self.seq_len, bool) or not isinstance(self.seq_len, int)
                                         or self.seq_len < 2):
            raise AttnkitValueError(f"seq_len must be an int >= 2 (tokens per row), got {self.seq_len!r}; omit it "
                                    "(--seq-len) to use the preset's max_seq_len.")
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise AttnkitValueError(f"warmup must be an int >= 0 (steps), got {self.warmup!r}; 0 = no warmup.")
        _number(self.lr, "lr", low=0.0, fix="a positive learning rate, e.g. 2e-3")
        _number(self.clip, "clip", low=0.0, allow_inf=True,
                fix="the maximum gradient norm, e.g. 1.0; pass inf to turn clipping off (a norm <= 0 would flip or "
                    "zero every update)")
        _number(self.weight_decay, "weight_decay", low=0.0, closed=True,
                fix="a decay >= 0, e.g. 0.1; 0 turns weight decay off (a negative decay grows the weights)")
        _number(self.min_lr_ratio, "min_lr_ratio", low=0.0, high=1.0, closed=True, fix="a share of lr in [0, 1]")
        _number(self.val_fraction, "val_fraction", low=0.0, high=1.0 - 1e-12, fix="a share of the data in (0, 1), e.g. 0.05")
        if len(self.betas) != 2 or any(isinstance(b, bool) or not isinstance(b, (int, float)) or not 0 <= b < 1
                                       for b in self.betas):
            raise AttnkitValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}; e.g. (0.9, 0.95).")
        if self.time_budget is not None and not self.time_budget > 0:
            raise AttnkitValueError(f"time_budget must be > 0 seconds, got {self.time_budget!r}; omit it to train "
                                    "for a fixed number of steps.")

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def _number(value, name: str, *, low: float, high: float = math.inf, closed: bool = False, allow_inf: bool = False,
            fix: str) -> None:
    """``value`` is a real number above ``low`` (at least ``low`` when ``closed``), below ``high``, finite unless
    ``allow_inf``; else a typed error naming the argument, its value and the fix."""
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and value == value
    ok = ok and (value >= low if closed else value > low) and value <= high
    ok = ok and (math.isfinite(value) or (allow_inf and value == math.inf))
    if not ok:
        raise AttnkitValueError(f"{name} must be {fix}; got {name}={value!r}.")


class TrainingDiverged(AttnkitError, FloatingPointError):
    """The loss or the gradient norm became NaN or infinite: the run stopped before the optimizer step."""


#: settings a resume honours; every other one is the run's own (change them with a new run and ``init_from``)
RESUME_HONOURS = ("steps", "device", "progress")


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


def cp_lm_loss(model, bare: TransformerLM, batch, precision: str, device: torch.device, groups) -> torch.Tensor:
    """:func:`lm_loss` on a context-parallel rank: its shard of every row, attention over the whole row.

    Scaled by ``cp`` so that DDP's average over all ``dp x cp`` ranks is the gradient of the whole batch's
    mean loss (and so is the averaged loss itself)."""
    B, L = batch.inputs.shape
    positions = batch.positions if batch.positions is not None else torch.arange(L, device=device).expand(B, L)
    layout = cp.layout_for(bare.mask(doc_ids=batch.doc_ids), L, groups.cp)  # balanced for the row's mask
    inputs, targets, local_positions = cp.shard_rows(layout, groups.cp_rank, batch.inputs, batch.targets, positions)
    documents = None if batch.doc_ids is None else masks.document(batch.doc_ids)  # needs the whole row
    with cp.sharded(layout, documents, positions=positions, group=groups.group, modules=bare), \
            autocast(precision, device):
        logits = model(inputs, positions=local_positions)  # (B, L_r, V)
    total = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="sum")
    return total * groups.cp / (B * L)


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
    """One run: data, model, optimizer, schedule and outputs; :meth:`run` trains to the last step.

    Everything is checked before the run folder is touched (settings, device, data, model, the checkpoint to
    resume or start from); then rank 0 takes the folder's lock (:class:`attnkit.runs.folder.RunFolder`).

    ``resume``: continue a run from its newest checkpoint (or one checkpoint folder). The run keeps its own
    settings; of ``config`` only :data:`RESUME_HONOURS` are used when named in ``given`` (the settings the
    user set explicitly), the rest of ``given`` is reported as ignored. ``steps`` beyond the original end
    extends the run: the schedule keeps its warmup + cosine to the original end, then holds the minimum rate.
    ``init_from``: start a new run from a checkpoint's weights (fine-tuning): its model, fresh optimizer, step 0.
    """

    def __init__(self, config: TrainConfig, *, resume: str | Path | None = None, init_from: str | Path | None = None,
                 given: set[str] | frozenset[str] = frozenset(), log=print):
        self.ddp, self.folder, self._failed, self.ctx = None, None, False, None
        self.hooks: list = []  # hook(trainer, record) after each step (main process), see train()
        try:
            self._setup(config, resume, init_from, frozenset(given), log)
        except BaseException:  # a refusal after the lock was taken must not keep the folder locked
            self._failed = True
            self.close()
            raise

    def _setup(self, config: TrainConfig, resume, init_from, given: frozenset[str], log) -> None:
        if resume is not None and init_from is not None:
            raise AttnkitValueError("resume and init_from exclude each other: --resume continues a run (same settings, "
                                    "its optimizer), --init-from starts a new run from a checkpoint's weights.")
        self.ctx = dist.init(config.device)  # a missing device is a typed error before anything is written
        self.log = log if self.ctx.is_main else (lambda *a, **k: None)
        self.resume_state, self.init_state, resume_ckpt, init_ckpt = None, None, None, None
        if resume is not None:
            resume_ckpt = ckpt.resolve(resume)
            run_dir = _run_folder_of(resume, resume_ckpt)
            if self.ctx.is_main:  # lock first: a run still training there must not change what is read
                self.folder = RunFolder(run_dir, log=self.log).acquire()
            self.resume_state = ckpt.read_state(resume_ckpt)  # its run identity checked against the folder
            if "train_config" not in self.resume_state:
                raise ckpt.CheckpointError(
                    f"--resume {str(resume)!r}: {resume_ckpt} was not written by the trainer (a converted model has no "
                    f"training state to continue); start a new run from its weights with --init-from {resume}.")
            config = self._resumed_config(config, given, run_dir)
            model_config = LMConfig.from_dict(self.resume_state["model_config"])  # the run's own model, never rebuilt
        elif init_from is not None:
            init_ckpt = ckpt.resolve(init_from)
            self.init_state = ckpt.read_state(init_ckpt)
            model_config = LMConfig.from_dict(self.init_state["model_config"])
            config = self._init_config(config, given, init_ckpt, model_config)
        else:
            model_config = None  # from the preset, once the data's row length is known
        if config.overfit:  # every step sees all the samples
            config = replace(config, batch_size=config.overfit_samples)
        self.config, self.device = config, self.ctx.device
        self.groups = cp.groups(self.ctx.rank, self.ctx.world, config.context_parallel)
        dist.check_batch(config.batch_size, replace(self.ctx, world=self.groups.dp))
        self.run_dir = Path(config.run_dir)
        if resume is None and self.ctx.is_main and self.run_dir.is_dir():  # refuse early, before loading data
            RunFolder(self.run_dir, log=self.log).check_fresh(config.overwrite)
        self.tokenizer = ByteTokenizer()
        self._build_data()
        torch.manual_seed(config.seed)
        if model_config is None:
            model_config = lm_config(config.preset, **{"vocab_size": self.tokenizer.vocab_size,
                                                       "max_seq_len": max(self.seq_len, PRESETS[config.preset]
                                                                          ["max_seq_len"]), **config.model})
        elif self.seq_len > model_config.max_seq_len:
            where = resume_ckpt or init_ckpt
            raise AttnkitValueError(f"seq_len={self.seq_len} exceeds max_seq_len={model_config.max_seq_len} of "
                                    f"the checkpoint {where}; pass --seq-len {model_config.max_seq_len} or less.")
        self.model_config = model_config
        self.model = TransformerLM(self.model_config).to(self.device)
        if init_ckpt is not None:
            ckpt.load_weights(init_ckpt, self.model)
            self.log(f"initialised from {init_ckpt} (step {self.init_state['step']}, run "
                     f"{self.init_state.get('run_id')}): a new run with its weights and a fresh optimizer")
        self.model.gradient_checkpointing = config.grad_checkpointing
        if self.groups.cp > 1:
            cp.check_model(self.model)
            self._cp_counting = contextlib.ExitStack()  # this rank's context-parallel bytes, per step in metrics
            self._cp_sent = self._cp_counting.enter_context(cp.count_messages())
        self.optimizer = torch.optim.AdamW(param_groups(self.model, config.weight_decay), lr=config.lr,
                                           betas=config.betas, fused=False, foreach=True)
        self.step = 0
        if resume_ckpt is not None:
            state, _ = ckpt.load_checkpoint(resume_ckpt, self.model, self.optimizer, rank=self.ctx.rank)
            self.step, self.precision = state["step"], state["precision"]
            self.precision_evidence = state.get("precision_evidence", {})
            self.run_id = state.get("run_id") or ckpt.run_identity(self.run_dir) or _new_run_id()
            self.schedule_steps = state.get("schedule_steps", state["total_steps"])
            self.total_steps = max(config.steps, self.step) if "steps" in given else state["total_steps"]
            self._report_resume(resume_ckpt, state)
        else:
            self.run_id = _new_run_id()
            self.precision, self.total_steps, self.precision_evidence = self._decide_precision_and_steps()
            self.schedule_steps = self.total_steps
            if self.ctx.is_main:  # everything checked: only now is the run folder touched
                self.folder = RunFolder(self.run_dir, log=self.log).acquire()
                self.folder.check_fresh(config.overwrite)
                if config.overwrite:
                    self.folder.set_aside()
            dist.barrier(self.ctx)
        if config.warmup >= self.schedule_steps and not config.overfit:
            peak = lr_at(self.schedule_steps, lr=config.lr, warmup=config.warmup, total=self.schedule_steps)
            self.log(f"note: warmup ({config.warmup} steps) is not shorter than the run ({self.schedule_steps} steps): "
                     f"the learning rate rises to {peak:.3g} at the last step and never decays; pass a smaller --warmup "
                     "for a warmup + cosine schedule")
        self.ddp = DistributedDataParallel(self.model) if self.ctx.enabled else None

    # ------------------------------------------------------------------------------------------ set-up
    def _resumed_config(self, config: TrainConfig, given, run_dir: Path) -> TrainConfig:
        saved = self.resume_state["train_config"]
        honoured = {n: getattr(config, n) for n in RESUME_HONOURS if n in given or n != "steps"}
        ignored = [f"{_flag(n)} {getattr(config, n)!r} (the run has {saved.get(n)!r})" for n in sorted(given)
                   if n not in RESUME_HONOURS and n not in ("run_dir", "model")
                   and saved.get(n, getattr(config, n)) != getattr(config, n)]
        if "model" in given:
            ignored += _ignored_model_flags(config.model, LMConfig.from_dict(self.resume_state["model_config"]),
                                            "the run has")
        if "run_dir" in given and Path(config.run_dir).resolve() != run_dir.resolve():
            ignored.insert(0, f"--run-dir {config.run_dir!r} (the run's folder is {str(run_dir)!r})")
        if ignored:
            self.log("--resume keeps the run's own settings; ignored: " + ", ".join(ignored)
                     + ". To change them start a new run from this checkpoint's weights with --init-from.")
        if "steps" in given and config.steps < self.resume_state["step"]:
            raise AttnkitValueError(f"--steps {config.steps} is below the checkpoint's step {self.resume_state['step']}; "
                                    "a resume can only continue or extend a run (pass --steps >= "
                                    f"{self.resume_state['step']}).")
        resumed = TrainConfig.from_dict({**saved, **honoured})
        resumed.run_dir = str(run_dir)
        return resumed

    def _init_config(self, config: TrainConfig, given, where: Path, model: LMConfig) -> TrainConfig:
        """A fine-tuning run's settings: the model is the checkpoint's, so the run records that model (its preset
        when the checkpoint's run had one, every model field) and not the preset or model flags it ignored."""
        base = self.init_state.get("train_config") or {}
        preset = base.get("preset") if base.get("preset") in PRESETS else config.preset
        ignored = []
        if "preset" in given and config.preset != base.get("preset"):
            ignored.append(f"--preset {config.preset!r} (the checkpoint's run has "
                           f"{base.get('preset', 'no preset')!r})")
        if "model" in given:
            ignored += _ignored_model_flags(config.model, model, "the checkpoint has")
        if ignored:
            self.log(f"--init-from builds the model of {where}: ignored " + ", ".join(ignored)
                     + ". To change the model, train a new run without --init-from.")
        seq_len = config.seq_len or min(PRESETS[preset]["max_seq_len"], model.max_seq_len)
        return replace(config, preset=preset, model=model.to_dict(), seq_len=seq_len)

    def _report_resume(self, where: Path, state: dict) -> None:
        self.log(f"resumed {where} at step {self.step}/{self.total_steps} ({self.precision}, chosen when the run "
                 "started)")
        if self.total_steps != state["total_steps"]:
            self.log(f"schedule: {state['total_steps']} -> {self.total_steps} steps; the learning rate keeps its warmup + "
                     f"cosine to step {self.schedule_steps}, then holds its minimum "
                     f"{self.config.lr * self.config.min_lr_ratio:.3g} to step {self.total_steps}"
                     if self.total_steps > self.schedule_steps else
                     f"schedule: stopping at step {self.total_steps}, before the cosine's end at step "
                     f"{self.schedule_steps}")
        elif self.step >= self.total_steps:
            self.log(f"the run already finished at step {self.step}; pass --steps N (N > {self.step}) to extend it")
        recorded = state.get("data_sha256")
        if recorded is not None and recorded != self.data_sha256:
            self.log(f"WARNING: the training data changed since this checkpoint (sha256 {recorded[:12]}... -> "
                     f"{self.data_sha256[:12]}...): the resumed run continues on different data, so it is no longer "
                     "the run it was")

    def _build_data(self) -> None:
        c = self.config
        self.seq_len = c.seq_len or PRESETS[c.preset]["max_seq_len"]
        docs = load_documents(c.data)
        self.data_sha256 = data_fingerprint(docs)
        train_docs, val_docs = split_by_file(docs, c.val_fraction)
        self.train_data = PackedDataset(train_docs, self.seq_len, doc_mask=c.doc_mask)
        self.val_data = PackedDataset(val_docs, self.seq_len, doc_mask=c.doc_mask)
        if c.overfit:  # the tutorial's sanity check: the same few rows every step
            self.train_data.num_rows = min(self.train_data.num_rows, c.overfit_samples)
        self.log(f"data: {c.data or 'Python standard library sources'} - {len(train_docs)} train / "
                 f"{len(val_docs)} val documents, {self.train_data.num_tokens:,} / {self.val_data.num_tokens:,} "
                 f"tokens, rows of {self.seq_len}, document mask {'on' if c.doc_mask else 'off'}")

    def _decide_precision_and_steps(self) -> tuple[str, int, dict]:
        c = self.config
        batch = self.train_data.batch(0, c.batch_size, seed=c.seed, rank=self.groups.dp_rank,
                                      world=self.groups.dp).to(self.device)
        rng = torch.get_rng_state()

        def fwd_bwd(precision: str):
            lm_loss(self.model, batch, precision, self.device).backward()
            self.model.zero_grad(set_to_none=True)

        evidence: dict = {}
        precision = c.precision
        if precision == "auto":
            precision, evidence = choose_precision(fwd_bwd, self.device)
            self.log(f"precision: {evidence['summary']} -> {precision}")
        steps = c.steps
        if c.time_budget is not None:
            step_time = evidence.get("median_s", {}).get(precision) or _time_once(fwd_bwd, precision)
            step_time = step_time * c.accum * 1.15  # optimizer step and bookkeeping
            evals = step_time * c.eval_batches / 3  # forward only, every eval_every steps
            steps = max(10, int(c.time_budget / (step_time + evals / c.eval_every)))
            self.log(f"time budget {c.time_budget:.0f} s at ~{step_time:.3f} s/step -> {steps} steps")
        torch.set_rng_state(rng)
        return precision, steps, evidence

    def _identity(self) -> dict:
        """What config.json and every checkpoint record about the run beyond its settings."""
        out = {"run_id": self.run_id, "precision": self.precision, "precision_evidence": self.precision_evidence,
               "total_steps": self.total_steps, "schedule_steps": self.schedule_steps, "data_sha256": self.data_sha256,
               "world": self.ctx.world}
        if self.init_state is not None:
            out["init_from"] = {"run_id": self.init_state.get("run_id"), "step": self.init_state["step"],
                                "model_sha256": self.init_state["sha256"][ckpt.FILES[0]]}
        return out

    def _write_config(self) -> None:
        """RUN/config.json: the settings and the identity of the run (replaced, never written through a link)."""
        record = {"train": asdict(self.config), "model": self.model_config.to_dict(), **self._identity()}
        with replacing(self.run_dir / RUN_CONFIG) as f:
            f.write(json.dumps(record, indent=1).encode())

    # ------------------------------------------------------------------------------------------ run
    def run(self) -> TrainResult:
        """Train to the last step; the process group and the run folder are released on every exit path."""
        try:
            return self._run()
        except BaseException:
            self._failed = True
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Drop the DistributedDataParallel wrapper, destroy the process group, release the run folder.

        DDP's reducer holds the gloo/nccl group; DDP objects sit in reference cycles, so without an explicit
        collection the group outlives ``destroy_process_group`` until interpreter shutdown, where tearing down
        gloo's worker threads aborts the process ("terminate called without an active exception", SIGABRT)
        in a timing-dependent share of runs.
        """
        if self.ddp is not None:
            self.ddp = None
            gc.collect()
        if self.ctx is not None:
            dist.shutdown(self.ctx)
        if self.folder is not None:
            if self._failed:
                self.folder.abandon()  # an --overwrite run that failed before its first checkpoint: old run back
            self.folder.release()
            self.folder = None

    def _run(self) -> TrainResult:
        c, ctx = self.config, self.ctx
        eval_batches = list(self.val_data.eval_batches(c.batch_size, c.eval_batches))
        if c.overfit:
            eval_batches = [self.train_data.rows(torch.arange(self.train_data.num_rows))]
        baseline = unigram_loss(self.train_data, eval_batches, self.tokenizer.vocab_size)
        resume_step = self.step if self.resume_state is not None else None
        self.metrics = MetricsWriter(self.run_dir / METRICS, resume_step=resume_step) if ctx.is_main else None
        if self.metrics is not None and self.resume_state is not None:
            problem = self.metrics.verify(self.resume_state.get("metrics"))
            if problem:
                self.log(f"WARNING: metrics.jsonl {problem}; the records after the checkpoint continue from step "
                         f"{self.step}")
        if ctx.is_main and resume_step is None:
            self._write_config()
        elif ctx.is_main and not ((self.run_dir / RUN_CONFIG).exists() or (self.run_dir / RUN_CONFIG).is_symlink()):
            self._write_config()  # its checkpoints agree on the run (read_state checked): the identity is back
            self.log(f"{self.run_dir / RUN_CONFIG} was missing: written again from the checkpoint (run {self.run_id})")
        n_params = self.model.num_parameters()
        tokens_per_step = c.batch_size * c.accum * self.seq_len
        origin = (f"{c.preset} preset" if self.resume_state is None and self.init_state is None
                  else "the checkpoint's own")
        self.log(f"model: {origin}, {_describe(self.model_config)}, {n_params / 1e6:.2f} M parameters, {self.precision}, "
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
            step = self.step + 1
            lr = lr_at(step, lr=c.lr, warmup=c.warmup, total=self.schedule_steps, min_lr_ratio=c.min_lr_ratio)
            if c.overfit:
                lr = c.lr  # no decay: the sanity check needs to reach ~0
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=self.device)
            for micro in range(c.accum):
                batch = self.train_data.batch((step - 1) * c.accum + micro, c.batch_size, seed=c.seed,
                                              rank=self.groups.dp_rank, world=self.groups.dp).to(self.device)
                sync_now = self.ddp is None or micro == c.accum - 1
                with _maybe_no_sync(self.ddp, sync_now):
                    loss = (lm_loss(self.ddp or self.model, batch, self.precision, self.device) if self.groups.cp == 1
                            else cp_lm_loss(self.ddp or self.model, self.model, batch, self.precision, self.device,
                                            self.groups)) / c.accum
                    loss.backward()
                loss_sum += loss.detach()
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), c.clip)
            loss_value = float(dist.mean(loss_sum, ctx))
            if not (math.isfinite(loss_value) and math.isfinite(float(grad_norm))):
                self._diverged(step, loss_value, float(grad_norm), lr)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            self.step = step
            tokens_done += tokens_per_step
            elapsed = time.perf_counter() - start
            record = {"step": self.step, "loss": loss_value, "lr": lr, "grad_norm": float(grad_norm),
                      "tokens": self.step * tokens_per_step, "tok_per_s": tokens_done / elapsed}
            if self.groups.cp > 1:
                record["cp_bytes_sent"] = self._cp_sent.nbytes()  # rank 0's context-parallel messages
                self._cp_sent.sent.clear()
            if self.step % c.eval_every == 0 or self.step == self.total_steps:
                val_loss = evaluate(self.model, eval_batches, self.precision, self.device)
                record.update(val_loss=val_loss, val_ppl=math.exp(min(val_loss, 50.0)))
            if self.metrics is not None:
                for hook in self.hooks:
                    hook(self, record)
                self.metrics.write(record)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.3f}", tok_s=f"{record['tok_per_s']:,.0f}",
                                **({"val": f"{val_loss:.3f}"} if val_loss is not None else {}))
            if self.step % c.ckpt_every == 0 or self.step == self.total_steps:
                self.save()
        if bar is not None:
            bar.close()
        if self.metrics is not None:
            self.metrics.close()
            plot_loss(self.run_dir / METRICS, self.run_dir / LOSS_PLOT, baseline)
        passed = None
        if c.overfit:
            passed = loss_value < 0.05
            self.log(f"overfit check on {self.train_data.num_rows} samples: final loss {loss_value:.4f} -> "
                     f"{'PASS' if passed else 'FAIL'} (needs < 0.05)")
        if val_loss is not None and not c.overfit:
            self.log(verdict(val_loss, baseline))
        if c.samples and ctx.is_main:
            samples["after"] = sample_text(self.model, c.sample_prompt, max_new_tokens=c.sample_tokens)
            self.log(f"--- sample after training ---\n{samples['after']}\n---")
        self.log(f"run folder: {self.run_dir} (checkpoints/, metrics.jsonl, loss.png, config.json)")
        return TrainResult(self.run_dir, self.step, loss_value, val_loss, baseline, self.precision, passed, samples)

    def _diverged(self, step: int, loss: float, grad_norm: float, lr: float) -> None:
        newest = ckpt.list_checkpoints(self.run_dir)
        kept = (f"the newest checkpoint {newest[-1]} is the last finite one (start a new run from its weights with "
                f"--init-from {newest[-1]} and a lower --lr)" if newest else "no checkpoint was written yet")
        raise TrainingDiverged(
            f"training stopped at step {step}: the loss is {loss} and the gradient norm {grad_norm} (lr {lr:.3g}); "
            f"nothing was saved for this step, {kept}. Usual causes: a learning rate too high (--lr {self.config.lr:g}), "
            "no warmup, or bf16 overflow (try --precision fp32).")

    def save(self) -> None:
        """Checkpoint the current step (rank 0 writes; every rank's RNG state is gathered first)."""
        extra = dist.gather_rng(self.ctx)
        if self.ctx.is_main:
            state = {**self._identity(),
                     "data_position": {"micro_batches": self.step * self.config.accum, "seed": self.config.seed},
                     "schedule": {"kind": "warmup+cosine", "step": self.step, "cosine_end": self.schedule_steps},
                     "train_config": asdict(self.config), "model_config": self.model_config.to_dict(),
                     "metrics": self.metrics.fingerprint() if getattr(self, "metrics", None) else None}
            ckpt.save_checkpoint(self.run_dir, self.step, self.model, self.optimizer, state, keep=self.config.keep,
                                 extra_tensors=extra)
            if self.folder is not None:
                self.folder.committed()  # the new run has a checkpoint: a run it replaced can go
        dist.barrier(self.ctx)


def verdict(val_loss: float, baseline: float) -> str:
    """The summary line: did the model beat the unigram baseline, said plainly."""
    gap = baseline - val_loss
    if gap > 0:
        return (f"validation loss {val_loss:.3f} (perplexity {math.exp(min(val_loss, 50.0)):.2f}) beat the unigram "
                f"baseline {baseline:.3f} by {gap:.3f} nats/token")
    return (f"validation loss {val_loss:.3f} (perplexity {math.exp(min(val_loss, 50.0)):.2f}) did NOT beat the unigram "
            f"baseline {baseline:.3f}: it is {-gap:.3f} nats/token worse; train longer (--steps) or check the data")


def data_fingerprint(docs) -> str:
    """SHA-256 over the documents' names and bytes: the identity of a run's data."""
    import hashlib

    h = hashlib.sha256()
    for name, data in docs:
        h.update(f"{len(name)}:{name}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()


def _new_run_id() -> str:
    import uuid

    return uuid.uuid4().hex


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


#: the command-line flags that set a model field (flag dest -> LMConfig field), see ``attnkit.cli.train``
MODEL_FLAGS = {"positions": "positions", "kv_heads": "n_kv_heads", "window": "window", "backend": "backend",
               "dropout": "dropout"}


def _ignored_model_flags(requested: dict, model: LMConfig, has: str) -> list[str]:
    """``--flag value (has its value)`` for each requested model field that differs from ``model``'s."""
    flags = {field: dest for dest, field in MODEL_FLAGS.items()}
    return [f"{_flag(flags.get(name, name))} {value!r} ({has} {getattr(model, name, None)!r})"
            for name, value in sorted(requested.items()) if getattr(model, name, None) != value]


def _run_folder_of(resume, where: Path) -> Path:
    """The run folder of the checkpoint ``where`` to resume: it must be one of ``RUN/checkpoints/step_*`` (a real
    folder, not a link), else a resume would take an unrelated grandparent folder as the run and write into it."""
    run_dir = where.parent.parent
    if where.parent.name != ckpt.CHECKPOINTS or where not in ckpt.list_checkpoints(run_dir):
        raise ckpt.CheckpointError(
            f"--resume {str(resume)!r}: {str(where)!r} is not a checkpoint inside a run folder (RUN/checkpoints/"
            "step_NNNNNNNN, a folder, not a link), so there is no run to continue; resume the run folder it belongs "
            f"to, or start a new run from its weights with --init-from {resume} --run-dir NEW.")
    return run_dir


def _describe(config: LMConfig) -> str:
    """The model in a few words, as built (not as asked)."""
    kv = f", {config.n_kv_heads} KV heads" if config.n_kv_heads not in (None, config.n_heads) else ""
    window = f", window {config.window}" if config.window is not None else ""
    return (f"{config.n_layers} layers, dim {config.dim}, {config.n_heads} heads{kv}, {config.positions} positions"
            f"{window}")


def train(config: TrainConfig, *, resume: str | Path | None = None, init_from: str | Path | None = None,
          given: set[str] | frozenset[str] = frozenset(), log=print, hooks=()) -> TrainResult:
    """Train, resume or fine-tune a run; see :class:`TrainConfig` and :class:`Trainer`. ``hooks``: callables
    ``hook(trainer, record)`` run on the main process after every step, before ``record`` (a dict with ``step``)
    is written to metrics.jsonl (e.g. ``attnkit.diagnostics.monitor.monitor_hook``, which adds the attention
    verdicts)."""
    trainer = Trainer(config, resume=resume, init_from=init_from, given=given, log=log)
    trainer.hooks = list(hooks)
    return trainer.run()


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
