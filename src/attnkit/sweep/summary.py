"""The sweep's summary: ``SWEEP/summary.json`` (everything), ``SWEEP/summary.md`` (the verdict, the best and the
baseline, every trial, the importances, the plan and its re-plans) and ``SWEEP/sweep.png`` (:mod:`figure`)."""

from __future__ import annotations

import json
import time

import optuna

from attnkit.runs.write import replacing
from attnkit.sweep import storage as stores
from attnkit.sweep.config import STANDARD
from attnkit.sweep.figure import draw
from attnkit.sweep.space import knobs_text
from attnkit.sweep.study import Context, counts, outcome

SUMMARY_MD, SUMMARY_JSON, FIGURE = "summary.md", "summary.json", "sweep.png"
WHY_BASELINE = ("the standard configuration scaled to the budget: the preset's width, depth, positions and learning "
                "rate (the size that trains in one trial's budget) with the Transformer's usual 8 heads, plain "
                "multi-head attention, no window and no dropout: exactly what the tutorial says may be more than a "
                "task needs, so the sweep measures whether it is")


def importances(study: optuna.Study) -> dict[str, float]:
    """PED-ANOVA importances of the searched knobs over the complete trials ({} when there are too few)."""
    complete = [t for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)) if t.params]
    if len(complete) < 2:
        return {}
    try:
        with stores.quiet_optuna():
            found = optuna.importance.get_param_importances(
                study, evaluator=optuna.importance.PedAnovaImportanceEvaluator())
    except (ValueError, RuntimeError, ZeroDivisionError):
        return {}
    return {k: round(float(v), 4) for k, v in found.items()}


def trial_rows(ctx: Context) -> list[dict]:
    rows = []
    for t in ctx.study.get_trials(deepcopy=False):
        retry = t.system_attrs.get("failed_trial")
        rows.append({"number": t.number, "role": t.user_attrs.get("role", "search"), "state": t.state.name,
                     "outcome": outcome(t), "counts": counts(t),
                     "value": t.value if t.state == optuna.trial.TrialState.COMPLETE else None,
                     "last_reported": t.intermediate_values[max(t.intermediate_values)] if t.intermediate_values else None,
                     "steps": t.user_attrs.get("steps"), "seconds": t.user_attrs.get("seconds"),
                     "params": t.user_attrs.get("params"), "config": t.user_attrs.get("config", {}),
                     "run_dir": t.user_attrs.get("run_dir"), "host": t.user_attrs.get("host"),
                     "retry_of": retry, "resumed": t.user_attrs.get("resumed", False)})
    return rows


def write_summary(ctx: Context, verdict: dict) -> dict:
    """Write the three files; returns the summary (the JSON)."""
    start = time.monotonic()
    plan = ctx.plan
    found = importances(ctx.study)
    payload = {"study": ctx.study.study_name, "preset": ctx.config.preset, "space": ctx.study.user_attrs["attnkit"][
        "config"]["space"], "baseline": {"config": ctx.baseline, "why": WHY_BASELINE}, "plan": plan.to_dict(),
        "time_budget": ctx.planner.summary(plan) if ctx.planner is not None else None, "workers": ctx.config.workers,
        "trials": trial_rows(ctx), "importances": found, "verdict": verdict,
        "storage": stores.masked(ctx.storage.url)}
    draw(ctx.folder / FIGURE, ctx.study.get_trials(deepcopy=False), found, verdict)
    payload["summary_s"] = round(time.monotonic() - start, 1)
    with replacing(ctx.folder / SUMMARY_JSON) as f:
        f.write(json.dumps(payload, indent=1, default=str).encode())
    with replacing(ctx.folder / SUMMARY_MD) as f:
        f.write(markdown(payload).encode())
    ctx.log(f"sweep: {verdict['words']}")
    ctx.log(f"sweep: summary {ctx.folder / SUMMARY_MD}, figure {ctx.folder / FIGURE} (written in "
            f"{payload['summary_s']:.1f} s)")
    return payload


def _knobs(config: dict, searched) -> str:
    return knobs_text(config, searched) or "-"


def _num(value, fmt: str = ".3f") -> str:
    return "-" if value is None else format(value, fmt)


def _group_row(role: str, g: dict | None, searched) -> str:
    if g is None:
        return f"| {role} | - | no complete trial | | | | | |"
    spread = f"{g['mean']:.3f} ± {_num(g['std'])} ({g['min']:.3f}..{g['max']:.3f})"
    return (f"| {role} | #{g['trial']} | {spread} | {g['search_val_loss']:.3f} | {g['params'] / 1e6:.2f} M | "
            f"{g['seconds']:.1f} | {g['steps']} | {_knobs(g['config'], searched) if role == 'best' else 'baseline'} |")


def markdown(p: dict) -> str:
    """summary.md from the summary's JSON."""
    searched, plan, v = p["space"], p["plan"], p["verdict"]
    length = f"{plan['trial_seconds']:.0f} s" if plan["trial_seconds"] else f"{plan['trial_steps']} steps"
    lines = [f"# Sweep {p['study']!r} on the `{p['preset']}` preset", "",
             f"**Verdict.** {v['words']}", "",
             f"| | trial | validation loss, {plan['seeds']} new seeds (mean ± std, range) | in the search | parameters "
             "| s per run | steps | knobs |", "|---|---|---|---|---|---|---|---|",
             _group_row("best", v["groups"].get("best"), searched),
             _group_row("baseline", v["groups"].get("baseline"), searched), "",
             f"**Baseline:** {_knobs(p['baseline']['config'], p['baseline']['config'])}: {p['baseline']['why']} "
             f"(standard attention: {STANDARD['heads']} heads).", "",
             f"**Space:** {' '.join(f'{k}={v}' for k, v in searched.items())}.", "",
             f"**Plan:** {plan['trials']} trials (the baseline included) of {length} each (~{plan['expected_steps']} "
             f"steps, evaluated every {plan['eval_every']} steps; Optuna TPE sampler, median pruner), "
             f"{p['workers']} worker(s) of {plan['threads']} thread(s), precision {plan['precision']}, storage "
             f"`{p['storage']}`."]
    if plan["replans"]:
        lines.append(f"Re-planned {len(plan['replans'])} time(s) as trials finished ([after trials, planned, new]: "
                     f"{plan['replans']}).")
    if p["time_budget"]:
        b = p["time_budget"]
        lines.append(f"Time budget {b['seconds']:.0f} s: {b['elapsed_s']:.0f} s when the summary began "
                     f"({p['summary_s']:.1f} s to write it).")
    lines += ["", "## Trials", "", "| # | role | state | validation loss | steps | s | parameters | knobs | run folder |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in p["trials"]:
        state = r["outcome"] or r["state"].lower()
        if r["retry_of"] is not None:
            state += f" (retry of #{r['retry_of']}{', resumed from its checkpoint' if r['resumed'] else ''})"
        loss = _num(r["value"]) if r["value"] is not None else (f"({_num(r['last_reported'])} last reported)"
                                                                if r["last_reported"] is not None else "-")
        lines.append(f"| {r['number']} | {r['role']} | {state} | {loss} | {r['steps'] or '-'} | "
                     f"{_num(r['seconds'], '.0f')} | {_num(r['params'] and r['params'] / 1e6, '.2f')} M | "
                     f"{_knobs(r['config'], searched)} | {r['run_dir'] or '-'} |")
    if p["importances"]:
        lines += ["", "**Importance** (PED-ANOVA): " + ", ".join(f"{k} {v:.2f}" for k, v in p["importances"].items())]
    lines += ["", f"![sweep]({FIGURE})", "",
              f"Every trial is a run folder: `attnkit report`, `doctor`, `generate` and `train --resume` work on it. "
              f"Open the study with `optuna-dashboard {p['storage']}` (`pip install optuna-dashboard`).", ""]
    return "\n".join(lines)
