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
        sp.set_defaults(run=module.run)
