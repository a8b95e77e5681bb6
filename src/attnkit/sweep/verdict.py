"""The honest verdict: the best configuration and the baseline, each re-run with ``seeds`` new seeds.

A sweep's best trial won a search among many, with one seed: some of its lead is luck. Both are re-trained from
scratch with seeds 1..S (new initialisation and data order) for the step count their trial ran (the same compute as
in the search), into ``SWEEP/verdict/{best,baseline}-seedK`` (ordinary run folders). The rule, fixed here before any
run: the best **beats the baseline beyond seed noise** when every one of its seeds ends with a lower validation loss
than every seed of the baseline (with S seeds each, pure noise orders them so with probability 1 / C(2S, S): 1 in 20
for 3 seeds); **worse beyond seed noise** the other way round; otherwise the two are **within seed noise**. Results
are kept in ``SWEEP/verdict.json`` as they come, so a resumed sweep re-runs only what is missing.
"""

from __future__ import annotations

import json
import math
import statistics
import time

from optuna.trial import TrialState

from attnkit.runs import list_checkpoints, read_metrics
from attnkit.runs.read import METRICS
from attnkit.runs.write import replacing
from attnkit.sweep.study import Context, is_baseline
from attnkit.sweep.trial import LOGS, log_to, trial_config
from attnkit.training import train

VERDICT, RESULTS = "verdict", "verdict.json"
BEATS, WORSE, NOISE = "beats the baseline beyond seed noise", "is worse than the baseline beyond seed noise", \
    "is within seed noise of the baseline"


def contenders(ctx: Context) -> dict:
    """``{"baseline": trial, "best": trial}``: the baseline and the best complete searched trial (None if none)."""
    trials = ctx.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    search = [t for t in trials if not is_baseline(t)]
    return {"baseline": next((t for t in trials if is_baseline(t)), None),
            "best": min(search, key=lambda t: t.value) if search else None}


def rerun(ctx: Context, trial, seed: int, name: str) -> dict:
    """Train ``trial``'s configuration with ``seed`` for the steps it ran; continue a re-run a kill interrupted."""
    run_dir = ctx.folder / VERDICT / name
    steps = int(trial.user_attrs["steps"])
    config = trial_config(ctx, trial.user_attrs["config"], run_dir, seed=seed, steps=steps, eval_every=steps)
    resume = run_dir if list_checkpoints(run_dir) else None
    config.overwrite = resume is None  # a re-run killed before its first checkpoint: the sweep's own folder
    start = time.monotonic()
    result = train(config, resume=resume, log=log_to(ctx.folder / LOGS / f"{name}.log"))
    records = [r for r in read_metrics(run_dir / METRICS) if "val_loss" in r]
    return {"trial": trial.number, "seed": seed, "val_loss": result.val_loss or records[-1]["val_loss"],
            "seconds": round(time.monotonic() - start, 2), "steps": steps, "resumed": resume is not None,
            "run_dir": str(run_dir.relative_to(ctx.folder))}


def stats(runs: list[dict], trial) -> dict:
    values = [r["val_loss"] for r in runs]
    return {"trial": trial.number, "config": trial.user_attrs["config"], "params": trial.user_attrs.get("params"),
            "steps": int(trial.user_attrs["steps"]), "search_val_loss": trial.value, "runs": runs,
            "mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "seconds": statistics.fmean(r["seconds"] for r in runs)}


def run_verdict(ctx: Context) -> dict:
    """Re-run the best and the baseline with ``seeds`` seeds each; the groups' statistics and the verdict."""
    path = ctx.folder / RESULTS
    done = json.loads(path.read_text()) if path.is_file() else {}
    groups = {}
    for role, trial in contenders(ctx).items():
        if trial is None:
            groups[role] = None
            continue
        if ctx.plan.seeds == 0:
            groups[role] = None
            continue
        runs = []
        for seed in range(1, ctx.plan.seeds + 1):
            name = f"{role}-seed{seed}"
            if done.get(name, {}).get("trial") != trial.number:
                ctx.log(f"sweep: verdict: re-running the {role} (trial #{trial.number}) with seed {seed}")
                done[name] = rerun(ctx, trial, seed, name)
                with replacing(path) as f:
                    f.write(json.dumps(done, indent=1).encode())
            runs.append(done[name])
        groups[role] = stats(runs, trial)
    return {"groups": groups, **judge(groups.get("best"), groups.get("baseline"), ctx.plan.seeds)}


def judge(best: dict | None, baseline: dict | None, seeds: int) -> dict:
    """The verdict in words by the rule of the module docstring, with the cost of each side."""
    if seeds == 0:
        return {"outcome": "no verdict", "words": "No verdict: seeds=0 re-runs nothing (the search's own values are "
                                                 "single seeds, their noise unknown)."}
    if best is None or baseline is None:
        missing = "the baseline did not complete" if baseline is None else "no searched trial completed"
        return {"outcome": "no verdict", "words": f"No verdict: {missing}."}
    chance = 1 / math.comb(2 * seeds, seeds)
    if best["max"] < baseline["min"]:
        outcome = BEATS
    elif best["min"] > baseline["max"]:
        outcome = WORSE
    else:
        outcome = NOISE
    spread = (f"{seeds} seeds each: best {best['mean']:.3f} ± {best['std'] or 0:.3f} (range {best['min']:.3f}.."
              f"{best['max']:.3f}) vs baseline {baseline['mean']:.3f} ± {baseline['std'] or 0:.3f} (range "
              f"{baseline['min']:.3f}..{baseline['max']:.3f})")
    if seeds == 1:
        outcome = "no estimate of seed noise"
        words = f"One seed each gives no estimate of the seed noise ({spread}); re-run with seeds=3 for a verdict."
    elif outcome == NOISE:
        words = (f"The best configuration (trial #{best['trial']}) {outcome}: their ranges overlap ({spread}), so "
                 "this sweep found nothing reliably better than the standard configuration.")
    else:
        words = (f"The best configuration (trial #{best['trial']}) {outcome}: every seed of one is better than every "
                 f"seed of the other ({spread}; pure seed noise would order them so with probability {chance:.2g}).")
    cost = (f" Cost: {best['params'] / 1e6:.2f} M parameters and {best['seconds']:.0f} s per run for the best, "
            f"{baseline['params'] / 1e6:.2f} M and {baseline['seconds']:.0f} s for the baseline.")
    return {"outcome": outcome, "words": words + cost, "chance": chance}
