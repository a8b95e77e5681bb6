"""The sweep's figure (``SWEEP/sweep.png``): four panels a person reads at a glance.

1. optimisation history: each trial's final validation loss by trial number (pruned trials at their last reported
   loss, marked x), the best so far, and the baseline's loss as a line (its re-runs' range shaded);
2. parameter importances: Optuna's PED-ANOVA importance of each searched knob (which knob moved the loss);
3. and 4. the loss against the number of heads and against the window (the tutorial's two knobs).
"""

from __future__ import annotations

from pathlib import Path

from optuna.trial import TrialState


def points(trials) -> list[dict]:
    """``{number, value, pruned, config, baseline}`` of each trial that trained (complete or pruned with a value)."""
    out = []
    for t in trials:
        if str(t.user_attrs.get("outcome", "")).startswith(("infeasible", "duplicate")):
            continue
        if t.state == TrialState.COMPLETE:
            value, pruned = t.value, False
        elif t.state == TrialState.PRUNED and t.intermediate_values:
            value, pruned = t.intermediate_values[max(t.intermediate_values)], True
        else:
            continue
        out.append({"number": t.number, "value": value, "pruned": pruned, "config": t.user_attrs.get("config", {}),
                    "baseline": t.user_attrs.get("role") == "baseline"})
    return out


def _history(ax, pts: list[dict], verdict: dict) -> None:
    done = [p for p in pts if not p["pruned"]]
    ax.scatter([p["number"] for p in done], [p["value"] for p in done], color="tab:blue", label="complete", zorder=3)
    pruned = [p for p in pts if p["pruned"]]
    ax.scatter([p["number"] for p in pruned], [p["value"] for p in pruned], marker="x", color="tab:gray",
               label="pruned (last reported)", zorder=3)
    best, xs, ys = float("inf"), [], []
    for p in sorted(done, key=lambda p: p["number"]):
        best = min(best, p["value"])
        xs.append(p["number"])
        ys.append(best)
    ax.step(xs, ys, where="post", color="tab:green", label="best so far")
    base = next((p for p in done if p["baseline"]), None)
    if base is not None:
        ax.axhline(base["value"], color="tab:red", linestyle="--", label="baseline")
    group = (verdict.get("groups") or {}).get("baseline")
    if group:
        ax.axhspan(group["min"], group["max"], color="tab:red", alpha=0.12, label="baseline re-runs (range)")
    ax.set(title="optimisation history", xlabel="trial", ylabel="validation loss (nats/token)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=7)


def _importances(ax, importances: dict[str, float]) -> None:
    if not importances:
        ax.text(0.5, 0.5, "importances need at least 2 complete\nsearched trials", ha="center", va="center")
        ax.set_axis_off()
        return
    names = list(importances)[::-1]
    ax.barh(names, [importances[n] for n in names], color="tab:purple")
    ax.set(title="parameter importance (PED-ANOVA)", xlabel="importance")


def _against(ax, pts: list[dict], knob: str) -> None:
    values = sorted({str(p["config"].get(knob)) for p in pts}, key=_order)
    if not values:
        ax.set_axis_off()
        return
    where = {v: i for i, v in enumerate(values)}
    for p in pts:
        x = where[str(p["config"].get(knob))]
        style = {"marker": "x", "color": "tab:gray"} if p["pruned"] else {"color": "tab:red" if p["baseline"]
                                                                          else "tab:blue"}
        ax.scatter([x], [p["value"]], **style)
    ax.set_xticks(range(len(values)), values)
    ax.set(title=f"validation loss against {knob}", xlabel=knob, ylabel="validation loss")


def _order(text: str):
    try:
        return (0, float(text))
    except ValueError:
        return (1, text)


def draw(path: Path, trials, importances: dict[str, float], verdict: dict) -> Path:
    """Write the four-panel figure to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = points(trials)
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    _history(axes[0][0], pts, verdict)
    _importances(axes[0][1], importances)
    _against(axes[1][0], pts, "heads")
    _against(axes[1][1], pts, "window")
    fig.suptitle("attnkit sweep: red = baseline, x = pruned")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
