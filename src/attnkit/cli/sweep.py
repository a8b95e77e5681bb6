"""``attnkit sweep``: the standard configuration as the baseline, a small search around it (Optuna), an honest verdict.

    attnkit sweep --preset tiny --minutes 10 --run-dir runs/sweep
    attnkit sweep --preset tiny --minutes 10 --space heads=1,2,4,8 window=none,64 --run-dir runs/heads
    attnkit sweep --preset tiny --trial-steps 200 --trials 8 --space my_space.toml --run-dir runs/s
    attnkit sweep --resume runs/sweep                       # after a crash, a kill -9 or a Ctrl-C
    attnkit sweep ... --workers 2                           # two processes on this machine, one study
    attnkit sweep ... --storage postgresql://me@db/sweeps   # a study other machines join:
    attnkit sweep --join --storage postgresql://me@db/sweeps --study NAME --run-dir runs/here

Writes RUN_DIR/summary.md, summary.json and sweep.png; every trial is a run folder in RUN_DIR/trials/.
"""

from __future__ import annotations

import sys

from attnkit.models.builders import PRESETS

#: flag dest -> SweepConfig field, for the flags that map one-to-one
FIELDS = ("run_dir", "preset", "minutes", "trials", "trial_steps", "seeds", "workers", "storage", "study", "data",
          "seq_len", "batch_size", "precision", "device", "seed", "heartbeat_s")


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="baseline + a small hyperparameter search (Optuna) + an honest verdict")
    p.add_argument("--run-dir", help="the sweep folder: study.db, trials/ (run folders), summary.md, sweep.png")
    p.add_argument("--resume", metavar="DIR", help="continue the sweep in DIR (after a crash, kill -9 or Ctrl-C)")
    p.add_argument("--join", action="store_true", help="add this machine's workers to --study in --storage")
    p.add_argument("--overwrite", action="store_true", help="replace the sweep (or run) in --run-dir (kept until the "
                                                            "new sweep's first finished trial)")
    p.add_argument("--preset", choices=sorted(PRESETS), help="model preset of the baseline (default tiny)")
    p.add_argument("--space", nargs="+", metavar="KNOB=VALUES", help="the search space: knob=v1,v2 or knob=lo..hi "
                   "words and/or a .toml file (knobs: heads kv_heads width head_dim layers positions window dropout lr "
                   "warmup; default: the preset's own space)")
    p.add_argument("--minutes", type=float, help="the whole sweep's time budget (trials, verdict, summary)")
    p.add_argument("--trial-steps", type=int, help="every trial trains this many steps (instead of --minutes)")
    p.add_argument("--trials", type=int, help="trials, the baseline included (default 12; --minutes re-plans it)")
    p.add_argument("--seeds", type=int, help="new seeds for the verdict's re-runs of the best and the baseline (3)")
    p.add_argument("--workers", type=int, help="worker processes on this machine (default 1)")
    p.add_argument("--storage", help="a database URL shared by machines (postgresql://...); default: RUN_DIR/study.db")
    p.add_argument("--study", help="the study's name (default: the folder's name and an id)")
    p.add_argument("--grid", action="store_true", help="every combination of the space's values instead of TPE")
    p.add_argument("--no-prune", action="store_true", help="no median pruner: every trial runs to its end")
    p.add_argument("--data", help="a text file or folder (default: the Python stdlib sources)")
    p.add_argument("--seq-len", type=int, help="tokens per row (default: the preset's)")
    p.add_argument("--batch-size", type=int, help="rows per step (default 16)")
    p.add_argument("--precision", choices=["auto", "fp32", "bf16"], help="default auto: measured once, for every trial")
    p.add_argument("--device", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, help="the trials' seed (the verdict's re-runs use 1..--seeds)")
    p.add_argument("--heartbeat-s", type=int, help="seconds between a running trial's heartbeats (default 10); a "
                                                   "trial silent for 3 of them is retried by another worker")
    p.set_defaults(run=run)


def config_from_args(args):
    from attnkit.sweep import SweepConfig, parse_words

    settings = {name: getattr(args, name) for name in FIELDS if getattr(args, name) is not None}
    if args.space is not None:
        settings["space"] = parse_words(args.space)
    return SweepConfig(**settings, overwrite=args.overwrite, grid=args.grid, prune=not args.no_prune)


def check_modes(args) -> None:
    """--resume and --join take the sweep's settings from its study: the settings of a new sweep are refused."""
    from attnkit.errors import AttnkitValueError

    mode = "resume" if args.resume is not None else "join" if args.join else None
    if mode is None:
        return
    given = [f"--{n.replace('_', '-')}" for n in (*FIELDS, "space") if getattr(args, n) is not None
             and n not in ("storage", "workers", "study", "run_dir")] + (["--grid"] if args.grid else [])
    if given:
        raise AttnkitValueError(f"{'resume=' + repr(args.resume) if mode == 'resume' else 'join=True'} keeps the "
                                f"sweep's own settings (in its study); {', '.join(given)} can't change them: start a "
                                "new sweep for other settings.")
    if mode == "join" and (args.storage is None or args.study is None):
        raise AttnkitValueError("join=True needs the shared study: pass storage= (its database URL) and study= (the "
                                "name the starting machine printed).")


def run(args) -> int:
    from attnkit.sweep import SweepInterrupted, join_sweep, resume_sweep, run_sweep

    check_modes(args)

    log = lambda *a: print(*a, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.resume is not None:
            resume_sweep(args.resume, storage=args.storage, workers=args.workers, log=log)
        elif args.join:
            join_sweep(args.run_dir or "runs/sweep-joined", storage=args.storage, study=args.study,
                       workers=args.workers or 1, log=log)
        else:
            run_sweep(config_from_args(args), log=log, spent_s=getattr(args, "startup_s", 0.0))
    except SweepInterrupted as exc:
        print(f"attnkit sweep: {exc}", file=sys.stderr)
        print(f"resume with: attnkit sweep --resume {exc.run_dir}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        folder = args.resume or args.run_dir
        print("attnkit sweep: interrupted; the running trial is enqueued again when the sweep resumes", file=sys.stderr)
        print(f"resume with: attnkit sweep --resume {folder}", file=sys.stderr)
        return 130
    return 0
