"""`attnkit report` and `attnkit heads` on every family of the shared zoo (:mod:`attnkit.integrations.hf.zoo`: tiny
random configs of 29 transformers families), each saved with `save_pretrained` (no tokenizer) and read from the
folder with `--ids`, as a user would; the test on a fast subset is tests/diagnostics/report/test_report_zoo.py.

Recorded per family: whether each command exited 0 (and its error line when not), the layer kinds and head facts
the page's layers table shows, the layers skipped and why, the heads table's shape, and the seconds.
Results: benchmarks/results/report_zoo.json.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/report_zoo.py [FAMILY ...]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

IDS = "5 9 12 30 41 5 9 12 30 41 7"  # 11 tokens, a repeated run (the induction detector has something to find)


def _layers(page: str) -> list[list[str]]:
    body = re.search(r'<table id="layers">.*?<tbody>(.*?)</tbody>', page, re.S).group(1)
    return [[re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
            for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body)]


def _run(args: list[str]) -> tuple[int, str, str]:
    from attnkit.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, out.getvalue(), err.getvalue()


def family(name: str, root: Path) -> dict:
    from attnkit.integrations.hf import zoo

    start = time.perf_counter()
    folder = root / name
    zoo.build(name).save_pretrained(folder)
    page_path = root / f"{name}.html"
    code, _, err = _run(["report", str(folder), "--ids", "--text", IDS, "--no-doctor", "--heads", "zero",
                         "--out", str(page_path)])
    result: dict = {"name": name, "report": code == 0}
    if code == 0:
        rows = _layers(page_path.read_text())
        result["layers"] = [{"layer": r[1], "kind": r[2], "heads": r[3], "head_size": r[4], "scale": r[5],
                             "sinks": r[6]} for r in rows if r[2] != "skipped"]
        result["skipped"] = [{"layer": r[1], "reason": r[3]} for r in rows if r[2] == "skipped"]
    else:
        result["report_error"] = err.strip().splitlines()[0] if err.strip() else f"exit {code}"
    code, out, err = _run(["heads", str(folder), "--ids", "--text", IDS, "--json"])
    result["heads"] = code == 0
    if code == 0:
        data = json.loads(out)
        result["heads_shape"] = [len(data["scores"]), len(data["scores"][0])]
    else:
        result["heads_error"] = err.strip().splitlines()[0] if err.strip() else f"exit {code}"
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("ATTNKIT_PROGRESS", "0")
    warnings.filterwarnings("ignore")
    import torch
    import transformers

    from attnkit.bench.common import write_results
    from attnkit.integrations.hf import zoo

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    names = argv or zoo.names()
    load = os.getloadavg()[0]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            results.append(family(name, Path(tmp)))
            r = results[-1]
            print(f"{name:12s} report {'ok' if r['report'] else 'FAIL'}  heads {'ok' if r['heads'] else 'FAIL'}  "
                  + ", ".join(x["kind"] for x in r.get("layers", [])) + (
                      f"; skipped {len(r['skipped'])}" if r.get("skipped") else "") + f"  ({r['seconds']} s)",
                  flush=True)
    ok = sum(r["report"] and r["heads"] for r in results)
    path = write_results("report_zoo", {
        "summary": f"report --ids --heads and heads --ids from save_pretrained folders: {ok} of {len(results)} "
                   "families work", "ids": IDS, "threads": torch.get_num_threads(),
        "load_1min": [round(load, 2), round(os.getloadavg()[0], 2)], "families": results})
    print(f"{ok} of {len(results)} families: report and heads work; wrote {path}")
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
