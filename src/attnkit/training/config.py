"""A run's settings, and the decisions about them when a run starts from a checkpoint.

:class:`TrainConfig` holds every setting of a run (stored in ``config.json`` and in each checkpoint).
:func:`resumed_config` and :func:`init_config` are plain functions of (the checkpoint's state, the config the
user passed, the settings the user named): what a resumed or a fine-tuning run keeps, and what it ignores
(returned as notes, for the caller to print). Settings are named in messages by ``names(field)`` (the field
itself by default; the CLI passes its flags, ``attnkit.cli.train.flag``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass, field, fields, replace
from pathlib import Path

from attnkit._checks import integer, number, positive_int
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import PRESETS
from attnkit.models.config import LMConfig, renamed_fields

#: the sanity check's own settings (``overfit=True``), unless given explicitly: a constant rate to a loss of ~0.
#: Rows of 64 tokens are memorised by step ~150 (loss 0.016; 0.010 at 200) in a sixth of the time of full rows
OVERFIT_DEFAULTS = {"steps": 200, "seq_len": 64, "warmup": 10, "weight_decay": 0.0, "lr": 3e-3, "eval_every": 50}
#: the same settings for a normal run
RUN_DEFAULTS = {"steps": 1000, "warmup": 50, "weight_decay": 0.1, "lr": 2e-3, "eval_every": 100}

#: settings a resume honours; every other one is the run's own (change them with a new run and ``init_from``)
RESUME_HONOURS = ("steps", "device", "progress")


def setting(name: str) -> str:
    """How the library names a setting in messages: the TrainConfig / LMConfig field itself."""
    return name


@dataclass
class TrainConfig:
    """Every setting of a run (stored in ``config.json`` and in each checkpoint).

    ``batch_size`` rows of ``seq_len`` tokens per micro-batch (global: split over ranks), ``accum``
    micro-batches per optimizer step. ``steps`` optimizer steps, or ``time_budget`` seconds: then the step
    count is set once from a measured step time and stored, so a resumed run follows the same schedule.
    ``precision``: ``"auto"`` (measure fp32 vs bf16 here, keep the faster), ``"fp32"`` or ``"bf16"``.
    ``overfit``: the sanity check (``overfit_samples`` rows every step until the loss is ~0); ``steps``,
    ``warmup``, ``weight_decay``, ``lr`` and ``eval_every`` left as None take :data:`OVERFIT_DEFAULTS`, else
    :data:`RUN_DEFAULTS` (so ``TrainConfig(overfit=True)`` is ``attnkit train --overfit``).
    ``names`` (not a setting): how a refused setting is named in the message (the CLI passes its flags).
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
    steps: int | None = None  # RUN_DEFAULTS / OVERFIT_DEFAULTS
    time_budget: float | None = None
    lr: float | None = None
    min_lr_ratio: float = 0.1
    warmup: int | None = None
    weight_decay: float | None = None
    betas: tuple[float, float] = (0.9, 0.95)
    clip: float = 1.0
    precision: str = "auto"
    grad_checkpointing: bool = False
    eval_every: int | None = None
    eval_batches: int = 8
    ckpt_every: int | None = None  # None: a tenth of the run, at most 100 steps (record.checkpoint_interval)
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
    names: InitVar[Callable[[str], str] | None] = None

    def __post_init__(self, names=None):
        n = names or setting
        for name, value in (OVERFIT_DEFAULTS if self.overfit else RUN_DEFAULTS).items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        self.betas = tuple(self.betas)
        if self.preset not in PRESETS:
            raise AttnkitValueError(f"{n('preset')} must be one of {sorted(PRESETS)}, got {self.preset!r}.")
        if self.precision not in ("auto", "fp32", "bf16"):
            raise AttnkitValueError(f"{n('precision')} must be 'auto', 'fp32' or 'bf16', got {self.precision!r}; use "
                                    "'auto' to measure and pick the faster here (never fp16 on CPU).")
        for name in ("batch_size", "accum", "steps", "eval_every", "eval_batches", "keep", "overfit_samples"):
            positive_int(getattr(self, name), n(name))
        if self.ckpt_every is not None:
            positive_int(self.ckpt_every, n("ckpt_every"))
        if self.seq_len is not None:
            integer(self.seq_len, n("seq_len"), low=2, fix="tokens per row; omit it to use the preset's max_seq_len.")
        integer(self.warmup, n("warmup"), low=0, fix="steps of warmup; 0 = no warmup.")
        self._check_numbers(n)

    def _check_numbers(self, n: Callable[[str], str]) -> None:
        number(self.lr, n("lr"), low=0.0, low_open=True, fix="a positive learning rate, e.g. 2e-3.")
        number(self.clip, n("clip"), low=0.0, low_open=True, allow_inf=True,
               fix="the maximum gradient norm, e.g. 1.0; pass inf to turn clipping off (a norm <= 0 would flip or "
                   "zero every update).")
        number(self.weight_decay, n("weight_decay"), low=0.0,
               fix="a decay >= 0, e.g. 0.1; 0 turns weight decay off (a negative decay grows the weights).")
        number(self.min_lr_ratio, "min_lr_ratio", low=0.0, high=1.0, high_closed=True, fix="a share of lr.")
        number(self.val_fraction, n("val_fraction"), low=0.0, high=1.0, low_open=True,
               fix="a share of the data, e.g. 0.05.")
        if len(self.betas) != 2:
            raise AttnkitValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}; e.g. (0.9, 0.95).")
        for i, beta in enumerate(self.betas):
            number(beta, f"betas[{i}]", low=0, high=1, fix="AdamW's betas are two numbers in [0, 1), e.g. (0.9, 0.95).")
        if self.time_budget is not None:
            number(self.time_budget, "time_budget", low=0.0, low_open=True,
                   fix="a number of seconds; omit it to train for a fixed number of steps.")

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        if isinstance(data.get("model"), dict):  # a run saved before LMConfig's renames (issue 20)
            data = {**data, "model": renamed_fields(data["model"])}
        return cls(**{k: v for k, v in data.items() if k in known})


def ignored_model_fields(requested: dict, model: LMConfig, has: str, names: Callable[[str], str] = setting
                         ) -> list[str]:
    """``name value (has its value)`` for each requested model field that differs from ``model``'s."""
    return [f"{names(name)} {value!r} ({has} {getattr(model, name, None)!r})"
            for name, value in sorted(requested.items()) if getattr(model, name, None) != value]


def resumed_config(config: TrainConfig, state: dict, given, run_dir: Path, names: Callable[[str], str] = setting
                   ) -> tuple[TrainConfig, list[str]]:
    """The settings of a resumed run: the run's own (``state["train_config"]``), except :data:`RESUME_HONOURS`
    the user named in ``given``; and a note naming what was given and ignored (empty when nothing was)."""
    saved = state["train_config"]
    honoured = {n: getattr(config, n) for n in RESUME_HONOURS if n in given or n != "steps"}
    ignored = [f"{names(n)} {getattr(config, n)!r} (the run has {saved.get(n)!r})" for n in sorted(given)
               if n not in RESUME_HONOURS and n not in ("run_dir", "model")
               and saved.get(n, getattr(config, n)) != getattr(config, n)]
    if "model" in given:
        ignored += ignored_model_fields(config.model, LMConfig.from_dict(state["model_config"]), "the run has", names)
    if "run_dir" in given and Path(config.run_dir).resolve() != run_dir.resolve():
        ignored.insert(0, f"{names('run_dir')} {config.run_dir!r} (the run's folder is {str(run_dir)!r})")
    if "steps" in given and config.steps < state["step"]:
        raise AttnkitValueError(f"{names('steps')} {config.steps} is below the checkpoint's step {state['step']}; a "
                                f"resume can only continue or extend a run (pass {names('steps')} >= {state['step']}).")
    resumed = TrainConfig.from_dict({**saved, **honoured})
    resumed.run_dir = str(run_dir)
    notes = [f"{names('resume')} keeps the run's own settings; ignored: " + ", ".join(ignored) + ". To change them "
             f"start a new run from this checkpoint's weights with {names('init_from')}."] if ignored else []
    return resumed, notes


def init_config(config: TrainConfig, state: dict, given, where: Path, model: LMConfig,
                names: Callable[[str], str] = setting) -> tuple[TrainConfig, list[str]]:
    """A fine-tuning run's settings: the model is the checkpoint's, so the run records that model (its preset
    when the checkpoint's run had one, every model field) and not the preset or model fields it ignored."""
    base = state.get("train_config") or {}
    preset = base.get("preset") if base.get("preset") in PRESETS else config.preset
    ignored = []
    if "preset" in given and config.preset != base.get("preset"):
        ignored.append(f"{names('preset')} {config.preset!r} (the checkpoint's run has "
                       f"{base.get('preset', 'no preset')!r})")
    if "model" in given:
        ignored += ignored_model_fields(config.model, model, "the checkpoint has", names)
    notes = [f"{names('init_from')} builds the model of {where}: ignored " + ", ".join(ignored)
             + f". To change the model, train a new run without {names('init_from')}."] if ignored else []
    seq_len = config.seq_len or min(PRESETS[preset]["max_seq_len"], model.max_seq_len)
    return replace(config, preset=preset, model=model.to_dict(), seq_len=seq_len), notes
