"""``attnkit bench doctor-zoo``: the doctor's verdicts on 29 transformers families (never a FAIL on a correct model).

Every family of :mod:`attnkit.integrations.hf.zoo` (tiny random configs of transformers' own config classes, run on
transformers' own implementation: the correct subjects) goes through ``ak.doctor.examine`` as a user would call it,
in one fresh process per code version. Recorded per family: the count of each verdict, every check's status and
evidence, and the seconds it took. With ``--baseline REV`` the same families run with attnkit as committed at ``REV``
(its ``src/`` exported from git), so the result holds the table before and after. The process builds each model
itself from the config class and settings the zoo names (the baseline has no zoo): the same weights as
``zoo.build`` (the seed, then ``from_config``). Results: ``benchmarks/results/doctor_zoo.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from attnkit.bench.common import RESULTS_DIR, export_revision, src_dir, write_results

SUMMARY = "the doctor's verdicts on 29 transformers families (tiny random configs), before and after a revision"
STATUSES = ("PASS", "WARN", "FAIL", "INFO", "SKIP")
SEED = 0  # every family's random weights: zoo.build(name, seed=SEED)

#: the process that examines the families sent on stdin (one JSON line each) with the attnkit on its PYTHONPATH
CHILD = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import attnkit as ak
from attnkit.diagnostics.checks import names
import torch, transformers
transformers.logging.set_verbosity_error()
for line in sys.stdin:
    family = json.loads(line)
    start = time.perf_counter()
    try:
        auto = transformers.AutoModelForMaskedLM if family["encoder"] else transformers.AutoModelForCausalLM
        torch.manual_seed(family["seed"])
        model = auto.from_config(getattr(transformers, family["config"])(**family["settings"])).eval()
        checks = None if family["checks"] is None else [c for c in family["checks"] if c in names()]
        report = ak.doctor.examine(model, checks=checks)
        out = {"checks": {r.name: [r.status, r.evidence] for r in report.results}}
    except Exception as exc:
        out = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    out.update(name=family["name"], seconds=round(time.perf_counter() - start, 2))
    print(json.dumps(out), flush=True)
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from attnkit.errors import EnvironmentUnsupportedError

    try:  # the parser of every command is built at start: no transformers must not break `attnkit heads` etc.
        from attnkit.integrations.hf import zoo

        families = zoo.names()
    except EnvironmentUnsupportedError:
        families = None  # the suite itself says what it needs when it runs
    parser.add_argument("--families", nargs="+", choices=families, default=families)
    parser.add_argument("--checks", nargs="+", default=None, help="run only these checks (default: all)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also examine the families with attnkit at this git revision (e.g. main)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)


def examine(src: Path, families: list[str], checks: list[str] | None, seed: int) -> dict[str, dict]:
    """``{family: {"checks": {name: [status, evidence]}, "counts", "seconds"}}`` from attnkit at ``src``."""
    from attnkit.integrations.hf import zoo

    lines = [json.dumps({"name": n, "config": zoo.FAMILIES[n].config, "settings": zoo.FAMILIES[n].settings,
                         "encoder": zoo.FAMILIES[n].encoder, "seed": seed, "checks": checks}) for n in families]
    env = dict(os.environ, PYTHONPATH=str(src), HF_HUB_OFFLINE="1", ATTNKIT_PROGRESS="0")
    done = subprocess.run([sys.executable, "-c", CHILD], input="\n".join(lines) + "\n", env=env,
                          capture_output=True, text=True)
    found = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            statuses = [status for status, _ in record.get("checks", {}).values()]
            record["counts"] = {s: statuses.count(s) for s in STATUSES}
            found[record.pop("name")] = record
    missing = [n for n in families if n not in found]
    if missing:
        raise RuntimeError(f"the doctor's process stopped before {missing} (exit {done.returncode}): "
                           f"{done.stderr[-500:]}")
    return found


def _cells(counts: dict[str, int]) -> str:
    return " ".join(f"{counts[s]}{s[0]}" for s in STATUSES)


def run(args) -> int:
    from attnkit.integrations.hf import zoo

    load = os.getloadavg()
    after = examine(src_dir(), args.families, args.checks, SEED)
    before, baseline = {}, None
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="attnkit_bench_doctor_zoo_") as tmp:
            before = examine(export_revision(args.baseline, Path(tmp)), args.families, args.checks, SEED)
        rev = subprocess.run(["git", "-C", str(src_dir().parent), "rev-parse", "--short", args.baseline],
                             capture_output=True, text=True, check=True).stdout.strip()
        baseline = f"{args.baseline} ({rev})"
    rows = {}
    for name in args.families:
        rows[name] = {"config": zoo.FAMILIES[name].config, "exercises": zoo.FAMILIES[name].note, "after": after[name]}
        if before:
            rows[name]["before"] = before[name]
        print(f"{name:<12} {_cells(after[name]['counts'])}"
              + (f"   (before: {_cells(before[name]['counts'])})" if before else "")
              + "".join(f"\n    {s} {c}: {e[:150]}" for c, (s, e) in after[name].get("checks", {}).items()
                        if s == "FAIL") + (f"\n    error: {after[name]['error']}" if "error" in after[name] else ""))
    totals = {side: {s: sum(rows[n][side]["counts"][s] for n in rows) for s in STATUSES}
              for side in ("after", "before") if before or side == "after"}
    failing = {side: [n for n in rows if rows[n][side]["counts"]["FAIL"]] for side in totals}
    for side, counts in totals.items():
        print(f"{side}: {_cells(counts)}; families with a FAIL: {len(failing[side])} {failing[side]}")
    path = write_results("doctor_zoo", {
        "families": rows, "totals": totals, "families_failing": failing, "baseline": baseline,
        "checks": args.checks or "all", "seed": SEED, "load_1min_start": load[0], "load_1min_end": os.getloadavg()[0],
        "note": "ak.doctor.examine(model) on transformers' own implementation of each family (fresh random weights, "
                "the attention implementation transformers picks); seconds include building the model"}, args.out)
    print(f"wrote {path}")
    return 0
