"""``attnkit tune``: calibrate the router's cost model on this machine (:mod:`attnkit.bench.tune`).

The coefficients go to the user's cache folder (never the repository), keyed by device, dtype and torch version;
``--show`` prints the calibration in force without timing anything.
"""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="measure this machine's routing cost coefficients (cached in the user's cache "
                                    "folder; auto then routes by predicted time)")
    p.add_argument("--dtypes", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"],
                   help="dtypes to calibrate (default both)")
    p.add_argument("--quick", action="store_true", help="a third of the grid (about a minute on 2 cores)")
    p.add_argument("--repeats", type=int, default=3, help="side-by-side rounds per call (default 3)")
    p.add_argument("--threads", type=int, default=None, help="torch threads while timing (default: torch's)")
    p.add_argument("--show", action="store_true", help="print the calibration in force and where it is, time nothing")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from attnkit.backends import cost
    from attnkit.errors import AttnkitValueError

    if args.show:
        active = cost.active(torch.device("cpu"))
        print(f"calibration file: {cost.calibration_path('cpu')}")
        print(f"in force: {active.source if active is not None else 'none (routing by rank)'}")
        if active is not None:
            print(json.dumps(active.to_json()["table"], indent=1, sort_keys=True))
        return 0
    if args.repeats < 1:
        raise AttnkitValueError(f"--repeats must be >= 1 (side-by-side rounds per call), got {args.repeats}; e.g. 3.")
    if args.threads is not None:
        if not 1 <= args.threads <= (__import__("os").cpu_count() or 1):
            raise AttnkitValueError(f"--threads must be between 1 and this machine's CPUs, got {args.threads}.")
        torch.set_num_threads(args.threads)
    from attnkit.bench.tune import calibrate

    print(f"attnkit tune: timing every priced backend ({', '.join(args.dtypes)}; forward and forward+backward)")
    calibration = calibrate(args.dtypes, quick=args.quick, repeats=args.repeats)
    path = cost.save(calibration, "cpu")
    worst = calibration.meta.get("worst_relative_error", {})
    for key in sorted(calibration.table):
        print(f"  {key}: worst fit error {worst.get(key, float('nan')):.2f}x")
    print(f"wrote {path}")
    return 0
