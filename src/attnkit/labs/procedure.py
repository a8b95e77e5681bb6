"""Lab ``procedure``: the tutorial's advice on choosing a configuration, judged with ``attnkit sweep``.

The tutorial ends with: the usual 8 heads / 512 dimensions / 6 layers are no law; *small tasks are often better
served by a small model with one or two heads, long documents by more heads with windowed sparse attention*; run
the standard configuration as the baseline, then a small search, and decide by the measured metric. Each of the two
claims is one sweep (``attnkit.sweep.run_sweep``, every combination of a small space: ``grid=True``) against the
standard baseline (8 heads, full attention), decided by the sweep's verdict: the best and the baseline re-run with 3
new seeds each.

- small task: a few hundred KB of text (the standard library's ``email`` package), 1 or 2 heads against 8 at the
  same width, every run the same number of steps (cost = the time a run takes);
- long documents: rows of 512 tokens (4x the ``nano`` preset's length) from the standard library's sources, 16 heads
  with a sliding window of 32 or 64 keys against the baseline, every trial the same seconds (``minutes``: equal
  compute), the re-runs the steps their trial ran in them.
"""

from __future__ import annotations

import shutil
import sysconfig
import tempfile
from pathlib import Path

from attnkit.labs.harness import learned
from attnkit.labs.registry import lab
from attnkit.labs.report import Claim, fmt
from attnkit.sweep import SweepConfig, run_sweep
from attnkit.sweep.verdict import BEATS

COMMON = {"preset": "nano", "precision": "fp32", "grid": True, "prune": False, "seeds": 3, "eval_batches": 4}
SIZES = {
    "default": {"small": {**COMMON, "data": "email", "seq_len": 64, "batch_size": 8, "trial_steps": 200,
                          "space": {"heads": [1, 2]}},
                "long": {**COMMON, "data": None, "seq_len": 512, "batch_size": 4, "minutes": 3.0,
                         "space": {"heads": [16], "window": [32, 64]}}},
    "quick": {"small": {**COMMON, "data": "json", "seq_len": 32, "batch_size": 4, "trial_steps": 3, "seeds": 2,
                        "space": {"heads": [1, 2]}},
              "long": {**COMMON, "data": "json", "seq_len": 64, "batch_size": 2, "trial_steps": 3, "seeds": 2,
                       "space": {"heads": [16], "window": [8]}}},
}


def _small(m: dict) -> tuple[str, list[bool]]:
    s = m["small"]
    best, base = s["best"], s["baseline"]
    text = (f"best of 1-2 heads (H={best['config']['heads']}): loss {fmt(best['mean'])} ± {fmt(best['std'])}, "
            f"{fmt(best['seconds'])} s/run; 8 heads: {fmt(base['mean'])} ± {fmt(base['std'])}, {fmt(base['seconds'])} "
            f"s/run; verdict: {s['outcome']}")
    return text, [best["mean"] <= 1.02 * base["mean"], best["seconds"] <= 0.9 * base["seconds"]]


def _long(m: dict) -> tuple[str, list[bool]]:
    s = m["long"]
    best, base = s["best"], s["baseline"]
    text = (f"16 heads, window {best['config']['window']}: loss {fmt(best['mean'])} ± {fmt(best['std'])} "
            f"({best['steps']} steps); baseline 8 heads full: {fmt(base['mean'])} ± {fmt(base['std'])} "
            f"({base['steps']} steps); verdict: {s['outcome']}")
    return text, [s["outcome"] == BEATS, best["mean"] <= 0.98 * base["mean"]]


def _curse(m: dict) -> tuple[str, list[bool]]:
    parts, texts = [], []
    for name in ("small", "long"):
        best, base = m[name]["best"], m[name]["baseline"]
        search, rerun = base["search_val_loss"] - best["search_val_loss"], base["mean"] - best["mean"]
        texts.append(f"{name}: lead {fmt(search)} in the search, {fmt(rerun)} re-run")
        parts.append(rerun < search)
    return "; ".join(texts), parts


CLAIMS = [
    Claim("On a small task, 1 or 2 heads are as good as the usual 8, at lower cost",
          "the better of 1 and 2 heads (3 new seeds, the same steps as the 8-head baseline): mean validation loss "
          "<= 1.02 x the baseline's, and mean time per run <= 0.9 x the baseline's",
          _small, needs=lambda m: learned(m["small"]["baseline"]["mean"], "the 8-head baseline")),
    Claim("On long documents, more heads with a sliding window beat the standard configuration at equal compute",
          "the better of 16 heads with a window of 32 or 64 keys (3 new seeds, the steps its trial ran in the same "
          "seconds as the baseline's): beats the baseline beyond seed noise (every seed below every baseline seed) "
          "and its mean validation loss <= 0.98 x the baseline's",
          _long, needs=lambda m: learned(m["long"]["baseline"]["mean"], "the 8-head baseline")),
    Claim("A search's best trial is optimistic (the winner's curse): re-run with new seeds its lead over the "
          "baseline shrinks, so the decision needs the re-runs",
          "in each sweep: (baseline - best) validation loss, mean of the re-runs < the same difference in the "
          "search's single-seed trials",
          _curse, needs=lambda m: learned(m["small"]["baseline"]["mean"], "the 8-head baseline")),
]


def corpus(name: str | None) -> str | None:
    """A standard-library package's sources as a small corpus (None: the whole standard library)."""
    return None if name is None else str(Path(sysconfig.get_paths()["stdlib"]) / name)


def one_sweep(settings: dict, seed: int, plots, name: str) -> dict:
    """Run one sweep in a temporary folder; its figure kept as this lab's ``NAME.png``; the verdict's numbers."""
    with tempfile.TemporaryDirectory(prefix="attnkit-lab-procedure-") as tmp:
        config = SweepConfig(run_dir=f"{tmp}/sweep", seed=seed,
                             **{**settings, "data": corpus(settings["data"])})
        summary = run_sweep(config, log=lambda *a, **k: None)
        shutil.copyfile(Path(tmp) / "sweep" / "sweep.png", plots.out / f"{name}.png")
        plots.files.append(f"{name}.png")
    verdict = summary["verdict"]
    pick = ("config", "mean", "std", "min", "max", "seconds", "steps", "params", "trial", "search_val_loss")
    return {"outcome": verdict["outcome"], "words": verdict["words"],
            **{role: {k: g[k] for k in pick} for role, g in verdict["groups"].items() if g is not None},
            "trials": [{k: r[k] for k in ("number", "role", "outcome", "value", "steps", "seconds")}
                       for r in summary["trials"]]}


@lab("procedure", "standard baseline, small search, decide by the metric (attnkit sweep)", sizes=SIZES, claims=CLAIMS)
def measure(params: dict, plots) -> dict:
    small = one_sweep(params["small"], params["seed"], plots, "small-task")
    long = one_sweep(params["long"], params["seed"], plots, "long-documents")
    notes = [f"Small task: {small['words']}", f"Long documents: {long['words']}",
             "Each sweep: the baseline (8 heads, full attention, the nano preset's width 64) and every combination of "
             "its space, then the best and the baseline re-run with 3 new seeds (attnkit sweep --grid --seeds 3)."]
    return {"small": small, "long": long, "notes": notes}
