"""The attention doctor: the pitfall checklist as automatic checks on any subject.

>>> import torch, attnkit as ak
>>> def my_attention(q, k, v, mask):                   # q, k, v (B, H, L, D); mask bool or None
...     scores = q @ k.transpose(-2, -1)                # forgot / sqrt(d_k)
...     if mask is not None:
...         scores = scores.masked_fill(~mask, float("-inf"))
...     return scores.softmax(-1) @ v
>>> report = ak.doctor.examine(my_attention)
>>> report["scale"].status
'FAIL'

``print(report)`` shows one line per check (PASS / WARN / FAIL / INFO / SKIP, the name, one line of evidence
and the fix for each failure); ``report.to_json()`` gives the same as JSON; ``report.ok`` is False on any FAIL.
Each check runs on a short probe of its own (random inputs, a few tokens; float64 only where it compares
outputs); ``attention-health`` runs on the user's text when one is given (``text=``), and says so.
"""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from attnkit.diagnostics.checks import FAIL, INFO, PASS, REGISTRY, SKIP, WARN, Options, Skip, names
from attnkit.diagnostics.checks.base import plain_call_error
from attnkit.diagnostics.subjects import TokenAdapter, make_subject
from attnkit.errors import AttnkitValueError

#: what the checks run on, unless a check's evidence says otherwise (attention-health on the user's text)
PROBES = ("seeded random probes (2 x 8 tokens or inputs; float64 where outputs are compared, or the most precise dtype "
          "the model runs) unless a line says otherwise")


@dataclass
class CheckResult:
    """One line of the report."""

    name: str
    status: str
    evidence: str
    fix: str = ""
    seconds: float = 0.0
    details: dict = field(default_factory=dict)


@dataclass
class Report:
    """The doctor's findings on one subject."""

    subject: str
    kind: str
    results: list[CheckResult]

    @property
    def ok(self) -> bool:
        """No check failed."""
        return all(r.status != FAIL for r in self.results)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def __getitem__(self, name: str) -> CheckResult:
        for r in self.results:
            if r.name == name:
                return r
        raise KeyError(f"no check named {name!r} in this report; checks: {[r.name for r in self.results]}")

    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.results) for s in (PASS, WARN, FAIL, INFO, SKIP)}

    def __str__(self) -> str:
        width = max(len(r.name) for r in self.results) if self.results else 10
        lines = [f"attnkit doctor: {self.subject} ({self.kind})", f"inputs: {PROBES}", ""]
        for r in self.results:
            lines.append(f"{r.status:<5} {r.name:<{width}}  {r.evidence}")
            if r.status == FAIL and r.fix:
                lines.extend(textwrap.wrap(r.fix, 110, initial_indent=" " * (width + 8) + "fix: ",
                                           subsequent_indent=" " * (width + 13), break_on_hyphens=False))
        c = self.counts()
        lines += ["", ", ".join(f"{n} {s}" for s, n in c.items()) + (" - no failures" if self.ok else " - FAILED")]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"subject": self.subject, "kind": self.kind, "inputs": PROBES, "ok": self.ok, "counts": self.counts(),
                "checks": [_jsonable(asdict(r)) for r in self.results]}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def examine(subject, *, checks: Sequence[str] | None = None, skip: Sequence[str] = (), embed_dim: int | None = None,
            adapter: TokenAdapter | None = None, fresh: bool | None = None, overfit: bool = False,
            overfit_steps: int = 150, seed: int = 0, name: str | None = None, loaded_from: str | None = None,
            text=None, text_note: str = "",
            thresholds=None, progress: Callable[[str, CheckResult | None], None] | None = None) -> Report:
    """Run the doctor's checks on ``subject`` and return a :class:`Report`.

    Args:
        subject: a bare attention function ``f(q, k, v, mask)`` (q, k, v ``(B, H, L, D)``; mask a bool tensor
            broadcastable to ``(B, H, Lq, Lk)``, True = may attend, or None), a module ``m(x, mask)`` on
            ``x (B, L, E)``, an :class:`attnkit.nn.MultiHeadAttention`, an attnkit model (decoder-model
            protocol) or a Hugging Face model.
        checks: run only these checks (names from ``attnkit.diagnostics.checks.names()``); default all.
        skip: check names to leave out (reported as SKIP).
        embed_dim: the input width E of a module, when it can't be read from the module.
        adapter: a :class:`TokenAdapter` telling the doctor how to call any other token model.
        fresh: True for a freshly initialised model (uniform attention is expected, the first loss must be
            ~log(vocab)), False for loaded weights (the initialisation checks SKIP), None if unknown: a Hugging
            Face model loaded with ``from_pretrained`` counts as loaded.
        overfit: also train a copy on 10 samples (slower), for at most ``overfit_steps`` Adam steps.
        seed: seed of every random input.
        loaded_from: where the weights were loaded from (a run, a checkpoint, a Hugging Face folder): implies
            ``fresh=False``, and the initialisation checks SKIP naming it.
        text: the user's token ids ``(L,)`` or ``(1, L)`` (the report's text): ``attention-health`` measures
            them (exactly as the report's metrics table does) instead of random tokens; ``text_note`` names them.
        thresholds: the :class:`~attnkit.diagnostics.metrics.HealthThresholds` of ``attention-health``.
        progress: called as ``progress(name, None)`` before each check and ``progress(name, result)`` after it.
    """
    unknown = [c for c in list(checks or []) + list(skip) if c not in REGISTRY]
    if unknown:
        raise AttnkitValueError(f"unknown check names {unknown}; choose from {names()}.")
    wrapped = make_subject(subject, embed_dim=embed_dim, adapter=adapter, name=name)
    because = "the subject is trained or loaded, not fresh (fresh=False)"
    if loaded_from is not None:
        fresh, because = False, f"the weights were loaded from {loaded_from}"
    elif fresh is None and wrapped.loaded:
        fresh, because = False, "the weights were loaded (from_pretrained)"
    if text is not None:
        text = torch.as_tensor(text).reshape(1, -1)  # (1, L)
    options = Options(seed=seed, fresh=fresh, not_fresh_because=because, overfit=overfit, overfit_steps=overfit_steps,
                      text=text, text_note=text_note, thresholds=thresholds)
    results = []
    notify = progress or (lambda check_name, result: None)
    for check_name in names():  # every registered check, in its declared order
        if checks is not None and check_name not in checks:
            continue
        if check_name in skip:
            results.append(CheckResult(check_name, SKIP, "skipped on request"))
            notify(check_name, results[-1])
            continue
        notify(check_name, None)
        results.append(_run_check(check_name, wrapped, options))
        notify(check_name, results[-1])
    return Report(wrapped.name, wrapped.kind, results)


def _run_check(check_name: str, wrapped, options: Options) -> CheckResult:
    """One registered check on the wrapped subject, timed: a ``Skip`` skips it; an error inside it is never evidence
    of what the check looks for: it SKIPs naming the error when the subject runs a plain call (the probe asked for
    something it can't take), and FAILs only when the subject raises on a plain call too (:func:`_crashed`)."""
    chk = REGISTRY[check_name]
    start = time.perf_counter()
    fix = chk.fix
    try:
        outcome = chk.run(wrapped, options)
        status, evidence, details = outcome.status, outcome.evidence, outcome.details
    except Skip as why:
        status, evidence, details = SKIP, str(why), {}
    except Exception as exc:  # noqa: BLE001 - the subject or the probe raised: say which
        status, evidence, fix = _crashed(wrapped, options, exc)
        details = {"raised": f"{type(exc).__name__}: {exc}"[:500]}
    return CheckResult(check_name, status, evidence, fix if status == FAIL else "",
                       round(time.perf_counter() - start, 3), details)


def _crashed(wrapped, options: Options, exc: Exception) -> tuple[str, str, str]:
    """(status, evidence, fix) of a check that raised ``exc``."""
    raised = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    memo = wrapped.notes.setdefault("plain_call", {})
    if "error" not in memo:
        memo["error"] = plain_call_error(wrapped, options)
    if memo["error"] is None:
        return SKIP, (f"could not run: its probe raised {raised} (a plain call of the subject runs: the probe asks for "
                      "an input, a dtype or a part this subject does not take)"), ""
    return FAIL, f"the subject raises on a plain call: {memo['error']} (this check raised {raised})", CRASH_FIX


CRASH_FIX = ("The subject raises on a plain call in its own dtype (no mask, no cache, no padding): fix that first; "
             "no check can say anything about a subject that does not run.")


__all__ = ["examine", "Report", "CheckResult", "PASS", "WARN", "FAIL", "INFO", "SKIP"]
