"""`attnkit bench dispatch` runs end to end on a tiny grid and records what it measured (never asserted as speed),
and the bench suites are discovered, not listed, with no import circle between the bench modules."""

import ast
import json
from pathlib import Path

import attnkit.bench as bench
from attnkit.bench.plots import replot
from attnkit.cli.main import main


def test_bench_dispatch_runs_and_records(tmp_path):
    assert main(["bench", "dispatch", "--overhead-repeats", "3", "--repeats", "2", "--sizes", "64",
                 "--contexts", "32", "--dtypes", "fp32", "--heads", "GQA", "MHA", "--batches", "1", "--q-lens", "1", "2",
                 "--out", str(tmp_path)]) == 0
    record = json.loads((tmp_path / "dispatch.json").read_text())
    assert set(record["overhead"]["overhead_us"]) == {"prepared", "unprepared", "no_mask"}
    assert [(r["n"], r["causal"]) for r in record["sizes"]] == [(64, False), (64, True)]
    rows = record["decode"]["rows"]
    assert len(rows) == 4 and {r["heads"] for r in rows} == {"GQA", "MHA"}
    assert all(r["ratio"] > 0 and r["best_sdpa"].startswith("sdpa") for r in rows)
    assert {"sdpa_gqa", "sdpa_repeat", "attnkit", "attnkit_prepared"} == set(
        next(r for r in rows if r["heads"] == "GQA")["median_us"])
    assert "float32 ctx=32" in record["decode"]["summary"]
    assert (tmp_path / "dispatch_decode.png").stat().st_size > 0
    (tmp_path / "dispatch_decode.png").unlink()
    assert [p.name for p in replot(tmp_path / "dispatch.json")] == ["dispatch_decode.png"]


def test_every_bench_module_with_add_arguments_and_run_is_a_suite():
    found = bench.suites()
    assert {"attention", "decode", "dispatch", "train", "linear", "plots", "report"} <= set(found)
    for name, module in found.items():
        assert bench.summary(module), f"suite {name} has no help line"
    assert bench.replotter("attention_window") is found["attention"].replot
    assert bench.replotter("dispatch") is found["dispatch"].replot
    assert bench.replotter("decode") is None


def test_no_import_circle_between_bench_modules():
    root = Path(bench.__file__).parent
    edges = {}
    for path in root.glob("*.py"):
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("attnkit.bench"):
                names |= {node.module.removeprefix("attnkit.bench").lstrip(".")} if node.module != "attnkit.bench" \
                    else {a.name for a in node.names if (root / f"{a.name}.py").exists()}
        edges[path.stem] = {n for n in names if n} - {path.stem}

    def reaches(start, goal, seen=()):
        return any(n == goal or (n not in seen and reaches(n, goal, (*seen, n))) for n in edges.get(start, ()))

    circles = sorted(m for m in edges if reaches(m, m))
    assert not circles, f"bench modules in an import circle: {circles} ({ {m: edges[m] for m in circles} })"
