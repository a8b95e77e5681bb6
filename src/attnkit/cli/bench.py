"""``attnkit bench <suite>``: the benchmark suites of ``attnkit.bench``, discovered (:func:`attnkit.bench.suites`).

Each suite module exposes ``add_arguments(parser)`` and ``run(args) -> int``; adding one is adding a file.
"""

from __future__ import annotations

from attnkit.bench import suites, summary


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark suite and record results under benchmarks/results/")
    parsers = p.add_subparsers(dest="suite", required=True)
    for name, module in suites().items():
        sp = parsers.add_parser(name, help=summary(module))
        module.add_arguments(sp)
        sp.set_defaults(run=checked(sp, module.run))


def checked(parser, run):
    """``run`` after the suite's arguments are checked: every number a size, a count or a budget (> 0; >= 0 where the
    flag's help gives 0 a meaning), ``--threads`` at most this machine's CPUs, ``--name`` a plain file name (see
    :func:`attnkit.bench.common.check_name`); it runs under :func:`attnkit.bench.common.begin` (threads pinned
    and printed, the load recorded in its results, a warning on a busy machine, a heartbeat line)."""

    def run_checked(args) -> int:
        import os
        import re

        from attnkit.bench.common import check_name
        from attnkit.errors import AttnkitValueError

        for action in parser._actions:
            value = getattr(args, action.dest, None)
            if action.type in (int, float) and value is not None:
                zero = re.search(r"\b0\b", action.help or "") is not None  # help gives 0 a meaning ("0: skip")
                for v in value if isinstance(value, list) else [value]:
                    if not (v >= 0 if zero else v > 0) or v == float("inf"):
                        raise AttnkitValueError(f"{action.option_strings[0]} must be {'>= 0' if zero else '> 0'} (a size, "
                                                f"a count or a budget), got {v!r}; see attnkit bench {args.suite} --help.")
        threads = getattr(args, "threads", None)
        most = max(threads) if isinstance(threads, list) else threads
        if most is not None and most > (os.cpu_count() or 1):
            raise AttnkitValueError(f"--threads {most} is more than this machine's {os.cpu_count()} CPUs; pass at most "
                                    "that.")
        if getattr(args, "name", None) is not None:
            check_name(args.name)
        from attnkit.bench.common import begin, end

        own_threads = any(a.dest == "threads" for a in parser._actions)
        begin(args.suite, threads_flag=own_threads)  # threads pinned and printed, the load recorded, a heartbeat
        try:
            return run(args)
        finally:
            end()

    return run_checked
