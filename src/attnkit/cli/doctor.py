"""``attnkit doctor``: run the attention doctor on a preset, a checkpoint or a Hugging Face model.

    attnkit doctor tiny                      # a fresh attnkit model from a preset
    attnkit doctor runs/demo --json          # a trained checkpoint, the report as JSON
    attnkit doctor hf-gpt2-tiny              # GPT-2 from a small config (also hf-llama-tiny, hf-bert-tiny)
    attnkit doctor path/to/hf_model --overfit

Progress goes to stderr, one line per check (``-q`` silences it), so ``--json`` on stdout stays clean. The exit
code is 1 when a check fails, 0 otherwise.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("doctor", help="check a model for the classic attention bugs (leaks, cache, scale, masks, NaN)")
    p.add_argument("target", help="a preset (tiny), an attnkit run/checkpoint folder, a Hugging Face folder, or "
                                  "hf-gpt2-tiny / hf-llama-tiny / hf-bert-tiny")
    p.add_argument("--encoder", action="store_true", help="build the preset as a bidirectional encoder")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--overfit", action="store_true", help="also train a copy on 10 samples (slower)")
    p.add_argument("--checks", nargs="+", default=None, help="run only these checks")
    p.add_argument("--skip", nargs="+", default=(), help="leave these checks out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr (the report alone)")
    p.set_defaults(run=run)


def progress_printer(stream=None):
    """``progress(name, result)`` for ``examine``: one line per check on ``stream`` (stderr). On a terminal the
    line of the running check is overwritten by its result; elsewhere (a pipe, CI) only results are written.
    None (no progress) with ``ATTNKIT_PROGRESS=0``, as everywhere in attnkit (:mod:`attnkit._progress`)."""
    import sys
    import time

    from attnkit._progress import _mode

    stream = stream or sys.stderr
    if _mode(stream) == "off":
        return None
    tty = stream.isatty() and _mode(stream) != "plain"
    start = time.perf_counter()

    def progress(name, result) -> None:
        if result is None:
            if tty:
                stream.write(f"\r  ... {name:<18}")
                stream.flush()
            return
        line = f"{result.status:<5} {name:<18} {result.seconds:6.2f} s  (total {time.perf_counter() - start:.1f} s)"
        stream.write(("\r" if tty else "") + line + "\n")
        stream.flush()

    return progress


def run(args) -> int:
    import torch

    from attnkit.diagnostics.doctor import examine
    from attnkit.runs import open_source

    torch.manual_seed(args.seed)
    source = open_source(args.target, encoder=args.encoder)
    report = examine(source.model, checks=args.checks, skip=args.skip, fresh=source.fresh, overfit=args.overfit,
                     seed=args.seed, name=args.target, loaded_from=args.target if source.loaded else None,
                     progress=None if args.quiet else progress_printer())
    print(report.to_json() if args.json else report)
    return report.exit_code
