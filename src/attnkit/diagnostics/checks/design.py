"""The model's intended departures from plain scaled dot-product attention, as its config declares them.

One INFO line lists every departure of :mod:`attnkit.diagnostics.departures` the config declares, each with its
field; the checks they touch say so in their own lines (the scale a config sets, a probe that does not apply).
"""

from __future__ import annotations

from attnkit.diagnostics.checks.base import INFO, PASS, Outcome, Skip, check
from attnkit.diagnostics.departures import READERS, departures


@check("departures", "intended departures",
       "Nothing to fix when the departure is what the model is meant to do; if it is not, correct the config field "
       "it names.", order=5)
def design(subject, options) -> Outcome:
    module = subject.module
    if module is None or getattr(module, "config", None) is None:
        raise Skip("no model config to read departures from (a bare function or a module without .config)")
    found = departures(module)
    details = {"departures": [{"field": d.field, "value": str(d.value), "says": d.says, "scale": d.scale,
                               "untested": d.untested} for d in found]}
    if not found:
        return Outcome(PASS, f"the config declares none of the {len(READERS)} known departures from plain "
                       "softmax(q k^T / sqrt(d)) v attention", details)
    return Outcome(INFO, f"{len(found)} by design: " + "; ".join(d.line() for d in found), details)
