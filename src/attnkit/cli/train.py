"""``attnkit train``: train a TransformerLM preset on text (default: the Python standard library's sources).

    attnkit train --preset tiny --steps 500 --run-dir runs/tiny
    attnkit train --resume runs/tiny               # after a crash or kill: continues bitwise on CPU
    attnkit train --resume runs/tiny --steps 800   # extend a run (the schedule holds its minimum beyond 500)
    attnkit train --init-from runs/tiny --data my.txt --run-dir runs/ft --lr 3e-4   # fine-tune its weights
    attnkit train --overfit                        # sanity check: 10 samples until the loss is ~0, PASS/FAIL
    torchrun --nproc-per-node 2 -m attnkit.cli.main train ...   # DistributedDataParallel, one shard per rank

A run folder is locked while it trains; a user error prints its message and exits 2 (``--debug``: traceback).
Ctrl-C or SIGTERM checkpoints the current step, prints the resume command and exits 128 + the signal.
"""

from __future__ import annotations

import math

from attnkit.cli import flags
from attnkit.errors import AttnkitValueError
from attnkit.models.builders import PRESETS
from attnkit.training.config import TrainConfig
from attnkit.training.loop import train

#: command-line flags that map one-to-one onto TrainConfig fields (dest -> field)
FIELDS = {"run_dir": "run_dir", "preset": "preset", "data": "data", "val_fraction": "val_fraction",
          "seq_len": "seq_len", "batch_size": "batch_size", "accum": "accum", "steps": "steps", "lr": "lr",
          "warmup": "warmup", "weight_decay": "weight_decay", "clip": "clip", "precision": "precision",
          "eval_every": "eval_every", "eval_batches": "eval_batches", "ckpt_every": "ckpt_every", "keep": "keep",
          "seed": "seed", "device": "device", "context_parallel": "context_parallel"}
#: the command-line flags that set a model field (flag dest -> LMConfig field)
MODEL_FLAGS = {"positions": "positions", "kv_heads": "num_kv_heads", "window": "window", "backend": "backend",
               "dropout": "dropout"}
SWITCHES = {"no_doc_mask": "doc_mask", "grad_checkpointing": "grad_checkpointing", "overwrite": "overwrite",
            "overfit": "overfit", "samples": "samples", "no_progress": "progress"}


def add_parser(sub) -> None:
    d = TrainConfig()
    p = sub.add_parser("train", help="train a TransformerLM preset (checkpoints, metrics, loss plot, resume, DDP)")

    def opt(flag, help_text, **kw):  # no argparse default: a flag is "given" exactly when it is not None
        default = getattr(d, FIELDS.get(flag.lstrip("-").replace("-", "_"), ""), None)
        p.add_argument(flag, default=None, help=help_text + (f" (default {default})" if default is not None else ""),
                       **kw)

    opt("--run-dir", "output folder: checkpoints/, metrics.jsonl, loss.png, config.json")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in a folder that holds a run (kept until the new run's first checkpoint) or "
                        "other files")
    p.add_argument("--resume", metavar="PATH", help="continue a run folder (its newest checkpoint) or one checkpoint; "
                                                    "keeps the run's settings (--steps may extend it)")
    p.add_argument("--init-from", metavar="CKPT", help="start a new run from a checkpoint's weights (fine-tuning)")
    opt("--preset", "model preset", choices=sorted(PRESETS))
    opt("--data", "a text file or a folder of text files (default: the Python stdlib sources)")
    opt("--val-fraction", "share of files for validation", type=float)
    opt("--seq-len", "tokens per row (default: the preset's max_seq_len)", type=int)
    p.add_argument("--no-doc-mask", action="store_true",
                   help="plain concatenate-and-chunk rows: no document mask, positions not restarted")
    opt("--batch-size", "rows per micro-batch (global, all ranks)", type=int)
    opt("--accum", "micro-batches per optimizer step", type=int)
    opt("--steps", "optimizer steps", type=int)
    p.add_argument("--minutes", type=float, help="train this long instead of --steps: the run ends at M minutes "
                                                  "from the command's start (the step count re-planned from "
                                                  "measured step times as it goes)")
    opt("--lr", "peak learning rate", type=float)
    opt("--warmup", "linear warmup steps", type=int)
    opt("--weight-decay", "AdamW weight decay of matrices (>= 0)", type=float)
    opt("--clip", "maximum gradient norm (> 0; inf = off)", type=float)
    opt("--precision", "auto = measure fp32 vs bf16 autocast here, keep bf16 only when clearly faster",
        choices=["auto", "fp32", "bf16"])
    p.add_argument("--grad-checkpointing", action="store_true", help="recompute each block in backward")
    opt("--eval-every", "steps between validation passes", type=int)
    opt("--eval-batches", "validation batches per pass", type=int)
    opt("--ckpt-every", "steps between checkpoints (default: a tenth of the run, at most 100; Ctrl-C or SIGTERM also "
        "checkpoints the current step)", type=int)
    opt("--keep", "checkpoints kept", type=int)
    opt("--seed", "random seed", type=int)
    opt("--device", "auto, cpu, cuda or cuda:N")
    p.add_argument("--positions", choices=["rope", "alibi", "sinusoidal", "learned", "none"])
    p.add_argument("--kv-heads", type=int, help="key/value heads (GQA/MQA)")
    p.add_argument("--window", type=int, help="sliding-window attention of this many keys")
    p.add_argument("--backend", help="attention backend (default auto)")
    p.add_argument("--dropout", type=float)
    opt("--context-parallel", "split each row's sequence over N ranks (under torchrun: world = data parallel x N)",
        type=int, metavar="N")
    p.add_argument("--overfit", action="store_true", help="sanity check: 10 samples until the loss is ~0")
    p.add_argument("--samples", action="store_true", help="print samples before and after training")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--monitor", type=int, nargs="?", const=100, default=None, metavar="EVERY",
                   help="attention monitor every EVERY steps (100 if no value): verdicts in metrics.jsonl, the report")
    p.set_defaults(run=run)


def flag(name: str) -> str:
    """The flag that sets the TrainConfig / LMConfig field (or the ``train`` argument) ``name``: how the trainer's
    messages name it on the command line (``num_kv_heads`` -> ``--kv-heads``, ``init_from`` -> ``--init-from``)."""
    dest = {field: dest for dest, field in {**FIELDS, **MODEL_FLAGS, "minutes": "time_budget"}.items()}.get(name, name)
    return flags.flag(dest)


def given_settings(args) -> set[str]:
    """The TrainConfig fields the user set on the command line."""
    given = {field for dest, field in FIELDS.items() if getattr(args, dest) is not None}
    given |= {field for dest, field in SWITCHES.items() if getattr(args, dest)}
    if any(getattr(args, dest) is not None for dest in MODEL_FLAGS):
        given.add("model")
    if args.minutes is not None:
        given.add("time_budget")
    return given


def config_from_args(args) -> TrainConfig:
    if args.minutes is not None and not (math.isfinite(args.minutes) and args.minutes > 0):
        raise AttnkitValueError(f"--minutes must be a number of minutes > 0, got {args.minutes}; e.g. --minutes 3, "
                                "or --steps N for a fixed number of steps.")
    if args.minutes is not None and args.resume is not None:
        raise AttnkitValueError(f"--minutes {args.minutes:g} sets the length of a new run; --resume {args.resume} "
                                "continues to the step count its checkpoint recorded (pass --steps N to extend it).")
    if args.minutes is not None and args.steps is not None:
        raise AttnkitValueError(f"--minutes {args.minutes:g} and --steps {args.steps} exclude each other: --minutes "
                                "ends the run at a time, --steps after a number of steps; pass one of them.")
    settings = {field: getattr(args, dest) for dest, field in FIELDS.items() if getattr(args, dest) is not None}
    settings["model"] = {field: getattr(args, dest) for dest, field in MODEL_FLAGS.items()
                         if getattr(args, dest) is not None}
    settings.update(doc_mask=not args.no_doc_mask, grad_checkpointing=args.grad_checkpointing,
                    overwrite=args.overwrite, overfit=args.overfit, samples=args.samples, progress=not args.no_progress,
                    time_budget=None if args.minutes is None else 60.0 * args.minutes)
    return TrainConfig(**settings, names=flag)  # overfit: TrainConfig's own defaults for what was not given


def run(args) -> int:
    hooks = []
    if args.monitor is not None:
        from attnkit.diagnostics.monitor import monitor_hook

        hooks.append(monitor_hook(args.monitor))
    result = train(config_from_args(args), resume=args.resume, init_from=args.init_from, given=given_settings(args),
                   hooks=hooks, names=flag, spent_s=getattr(args, "startup_s", 0.0))
    if result.overfit_passed is not None:
        return 0 if result.overfit_passed else 1
    return 0

