"""``attnkit lab``: the tutorial's claims as experiments with honest verdicts.

    attnkit lab list                     # the labs and what each one tests
    attnkit lab scale                    # default size (minutes on 2 CPU cores), into runs/labs/scale/
    attnkit lab positions --quick        # CI size (seconds)
    attnkit lab all --quick --out DIR    # every lab, each into DIR/NAME/

Each run writes results.json, summary.md (claim -> measured -> verdict) and PNG plots. ``--out`` must be absent,
empty or an earlier output of the same lab, else it is refused (exit 2) unless ``--overwrite``.
"""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("lab", help="run a lab: a claim about attention as a small experiment with a verdict")
    p.add_argument("name", help="a lab name, 'all', or 'list'")
    p.add_argument("--quick", action="store_true", help="CI size: seconds instead of minutes")
    p.add_argument("--out", default=None, help="output folder (default runs/labs/NAME; with 'all', DIR/NAME)")
    p.add_argument("--overwrite", action="store_true",
                   help="write into an --out that is not empty and not an earlier output of the lab (nothing deleted)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.set_defaults(run=run)


def run(args) -> int:
    from pathlib import Path

    from attnkit.labs import LABS, get_lab, run_lab
    from attnkit.labs.report import check_out_folder

    if args.name == "list":
        for name, spec in LABS.items():
            print(f"{name:<11} {spec.title}")
        return 0
    names = list(LABS) if args.name == "all" else [get_lab(args.name).name]
    outs = {name: Path("runs") / "labs" / name if args.out is None else
            Path(args.out) / name if args.name == "all" else Path(args.out) for name in names}
    for name, out in outs.items():  # every folder before any lab runs: a refusal costs nothing
        check_out_folder(out, name, args.overwrite, option="--out")
    for name, where in outs.items():
        payload = run_lab(name, quick=args.quick, out=where, seed=args.seed, threads=args.threads,
                          overwrite=args.overwrite)
        print(f"lab {name} ({payload['size']}, {payload['seconds']:.0f} s) -> {where}/summary.md")
        for v in payload["verdicts"]:
            print(f"  {v['verdict']:<28} {v['claim']}")
            print(f"  {'':<28}   measured: {v['measured']}")
    return 0
