"""``attnkit train``: train a TransformerLM preset on text (default: the Python standard library's sources).

    attnkit train --preset tiny --steps 500 --run-dir runs/tiny
    attnkit train --resume runs/tiny               # after a crash or kill: continues bitwise on CPU
    attnkit train --overfit                        # sanity check: 10 samples until the loss is ~0, PASS/FAIL
    torchrun --nproc-per-node 2 -m attnkit.cli.main train ...   # DistributedDataParallel, one shard per rank
"""

from __future__ import annotations

import argparse

from attnkit.models.builders import PRESETS
from attnkit.training.loop import TrainConfig, train


def add_parser(sub) -> None:
    d = TrainConfig()
    p = sub.add_parser("train", help="train a TransformerLM preset (checkpoints, metrics, loss plot, resume, DDP)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--run-dir", default=d.run_dir, help="output folder: checkpoints/, metrics.jsonl, loss.png")
    p.add_argument("--overwrite", action="store_true", help="start afresh in a run folder that has checkpoints")
    p.add_argument("--resume", metavar="PATH", help="resume a run folder (its newest checkpoint) or one checkpoint")
    p.add_argument("--preset", default=d.preset, choices=sorted(PRESETS))
    p.add_argument("--data", help="a text file or a folder of text files (default: the Python stdlib sources)")
    p.add_argument("--val-fraction", type=float, default=d.val_fraction, help="share of files for validation")
    p.add_argument("--seq-len", type=int, help="tokens per row (default: the preset's max_seq_len)")
    p.add_argument("--no-doc-mask", action="store_true",
                   help="plain concatenate-and-chunk rows: no document mask, positions not restarted")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="rows per micro-batch (global, all ranks)")
    p.add_argument("--accum", type=int, default=d.accum, help="micro-batches per optimizer step")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    p.add_argument("--minutes", type=float, help="train for about this long instead of --steps (schedule fixed "
                                                  "from a measured step time)")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--clip", type=float, default=d.clip)
    p.add_argument("--precision", default=d.precision, choices=["auto", "fp32", "bf16"],
                   help="auto = measure fp32 vs bf16 autocast on this machine and keep the faster")
    p.add_argument("--grad-checkpointing", action="store_true", help="recompute each block in backward")
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--eval-batches", type=int, default=d.eval_batches)
    p.add_argument("--ckpt-every", type=int, default=d.ckpt_every)
    p.add_argument("--keep", type=int, default=d.keep, help="checkpoints kept")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--device", default=d.device, help="auto, cpu, cuda")
    p.add_argument("--positions", choices=["rope", "alibi", "sinusoidal", "learned", "none"])
    p.add_argument("--kv-heads", type=int, help="key/value heads (GQA/MQA)")
    p.add_argument("--window", type=int, help="sliding-window attention of this many keys")
    p.add_argument("--backend", help="attention backend (default auto)")
    p.add_argument("--dropout", type=float)
    p.add_argument("--context-parallel", type=int, default=d.context_parallel, metavar="N",
                   help="split each row's sequence over N ranks (under torchrun: world = data parallel x N)")
    p.add_argument("--overfit", action="store_true", help="sanity check: 10 samples until the loss is ~0")
    p.add_argument("--samples", action="store_true", help="print samples before and after training")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--monitor", type=int, nargs="?", const=100, default=None, metavar="EVERY",
                   help="attention monitor every EVERY steps (100 if no value): verdicts in metrics.jsonl, the report")
    p.set_defaults(run=run)


def config_from_args(args) -> TrainConfig:
    model = {k: v for k, v in {"positions": args.positions, "n_kv_heads": args.kv_heads, "window": args.window,
                               "backend": args.backend, "dropout": args.dropout}.items() if v is not None}
    settings = dict(
        run_dir=args.run_dir, preset=args.preset, model=model, data=args.data, val_fraction=args.val_fraction,
        seq_len=args.seq_len, doc_mask=not args.no_doc_mask, batch_size=args.batch_size, accum=args.accum,
        steps=args.steps, time_budget=None if args.minutes is None else 60.0 * args.minutes, lr=args.lr,
        warmup=args.warmup, weight_decay=args.weight_decay, clip=args.clip, precision=args.precision,
        grad_checkpointing=args.grad_checkpointing, eval_every=args.eval_every, eval_batches=args.eval_batches,
        ckpt_every=args.ckpt_every, keep=args.keep, seed=args.seed, device=args.device, overfit=args.overfit,
        overwrite=args.overwrite,
        samples=args.samples, progress=not args.no_progress, context_parallel=args.context_parallel,
    )
    if args.overfit:  # the sanity check's own defaults, unless given explicitly
        defaults = TrainConfig()
        for name, value in {"steps": 300, "warmup": 10, "weight_decay": 0.0, "lr": 3e-3,
                            "eval_every": 50}.items():
            if settings[name] == getattr(defaults, name):
                settings[name] = value
    return TrainConfig(**settings)


def run(args) -> int:
    hooks = []
    if args.monitor is not None:
        from attnkit.diagnostics.monitor import monitor_hook

        hooks.append(monitor_hook(args.monitor))
    result = train(config_from_args(args), resume=args.resume, hooks=hooks)
    if result.overfit_passed is not None:
        return 0 if result.overfit_passed else 1
    return 0
