"""A training callback that watches attention health per layer and head.

>>> monitor = AttentionMonitor(model, sample_tokens, every=100)
>>> for step in range(steps):
...     train_step()
...     monitor(step)            # every 100 steps: one no-grad forward on the sample, metrics, warnings

Every ``every`` steps the monitor runs the model on a fixed sample under :class:`capture` (eval mode, no
grad, the training mode is restored), computes :func:`head_metrics` per layer/head, appends them to
``history``, logs one line per layer to the ``attnkit.diagnostics`` logger (and to ``log_fn(step, summary)``
if given, e.g. a TensorBoard writer) and warns (:class:`AttentionHealthWarning`) when

- heads collapse (near one-hot) or go uniform (they learned nothing; expected only at step 0),
- attention logits (pre-softmax scores) exceed ``thresholds.max_logit``, or grow without bound: the max
  logit rose at each of the last ``thresholds.growth_window`` checks and doubled over them.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable

import torch
from torch import nn

from attnkit._checks import positive_int
from attnkit.diagnostics.capture import capture
from attnkit.diagnostics.metrics import HealthThresholds, max_logit, record_metrics
from attnkit.errors import AttnkitTypeError, describe

LOGGER = logging.getLogger("attnkit.diagnostics")


class AttentionHealthWarning(UserWarning):
    """Heads collapsed, went uniform, or attention logits are growing without bound."""


class AttentionMonitor:
    """Callable every step; measures attention health every ``every`` steps.

    Args:
        model: the model being trained (its attention modules name the layers).
        inputs: the fixed sample: a tensor (``model(inputs)``), a tuple (``model(*inputs)``) or a dict
            (``model(**inputs)``).
        every: check period in steps (>= 1).
        thresholds: verdict and logit thresholds.
        warn_uniform_after: uniform heads are only warned about from this step on (they are normal at init).
        log_fn: optional ``log_fn(step, summary)`` receiving the summary dict of each check.
    """

    def __init__(self, model: nn.Module, inputs, *, every: int = 100, thresholds: HealthThresholds | None = None,
                 warn_uniform_after: int = 1, log_fn: Callable | None = None):
        if not isinstance(model, nn.Module):
            raise AttnkitTypeError(f"AttentionMonitor model must be a torch.nn.Module, got {describe(model)}.")
        positive_int(every, "every", "the steps between checks, e.g. every=100.")
        self.model, self.inputs, self.every = model, inputs, every
        self.thresholds = thresholds or HealthThresholds()
        self.warn_uniform_after, self.log_fn = warn_uniform_after, log_fn
        self.history: list[dict] = []

    def _forward(self) -> None:
        x = self.inputs
        if isinstance(x, dict):
            self.model(**x)
        elif isinstance(x, (tuple, list)):
            self.model(*x)
        else:
            self.model(x)

    def measure(self) -> dict:
        """One check now: ``{layer: {"metrics": HeadMetrics dict, "verdicts": [...], "max_logit": float}}``."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), capture(self.model, scores=True) as cap:
                self._forward()
        finally:
            self.model.train(was_training)
        summary = {}
        for layer, records in cap.by_layer().items():
            record = records[-1]  # the last call of the layer on this sample
            metrics = record_metrics(record)
            summary[layer] = {"metrics": metrics.to_dict(), "verdicts": metrics.verdicts(self.thresholds),
                              "max_logit": max(max_logit(r) for r in records)}
        return summary

    def __call__(self, step: int) -> dict | None:
        """Check at multiples of ``every``; returns the summary, or None on other steps."""
        if step % self.every:
            return None
        summary = self.measure()
        self.history.append({"step": step, "layers": summary})
        for layer, info in summary.items():
            m = info["metrics"]
            LOGGER.info("step %d %s: entropy %s max_prob %s sink %s max_logit %.2f verdicts %s", step, layer or "<model>",
                        _fmt(m["norm_entropy"]), _fmt(m["max_prob"]), _fmt(m["sink_mass"]), info["max_logit"],
                        info["verdicts"])
            self._warn(step, layer, info)
        if self.log_fn is not None:
            self.log_fn(step, summary)
        return summary

    def _warn(self, step: int, layer: str, info: dict) -> None:
        name = layer or "<model>"
        for verdict, what in (("collapsed", "collapsed (near one-hot attention)"),
                              ("uniform", "uniform (entropy near log n: attends to everything equally)")):
            heads = [h for h, v in enumerate(info["verdicts"]) if v == verdict]
            if heads and (verdict != "uniform" or step >= self.warn_uniform_after):
                warnings.warn(f"step {step}: layer {name} heads {heads} {what}", AttentionHealthWarning, stacklevel=3)
        t = self.thresholds
        logit = info["max_logit"]
        if not math.isnan(logit) and logit > t.max_logit:
            warnings.warn(f"step {step}: layer {name} attention logits reach {logit:.1f} > {t.max_logit}: the softmax "
                          "saturates; lower the learning rate, add QK-norm or a logit softcap", AttentionHealthWarning,
                          stacklevel=3)
        past = [h["layers"].get(layer, {}).get("max_logit", math.nan) for h in self.history[-(t.growth_window + 1):]]
        if len(past) == t.growth_window + 1 and all(b > a for a, b in zip(past, past[1:])) and past[-1] >= 2 * past[0]:
            warnings.warn(f"step {step}: layer {name} attention logits grew at each of the last {t.growth_window} "
                          f"checks, {past[0]:.2f} -> {past[-1]:.2f}: they are growing without bound; lower the "
                          "learning rate, add weight decay, QK-norm or a logit softcap", AttentionHealthWarning,
                          stacklevel=3)


def _fmt(values: list[float]) -> str:
    return "[" + " ".join(f"{v:.2f}" for v in values) + "]"


def monitor_hook(every: int = 100, *, thresholds: HealthThresholds | None = None):
    """A training hook (``attnkit.training.train(..., hooks=[monitor_hook(100)])``, ``attnkit train --monitor``):
    at step 1 and every ``every`` steps it measures attention health on the first validation row (its documents
    and positions kept) and adds ``record["attention"] = {layer: {"verdicts", "max_logit", metrics...}}`` to the
    step's metrics.jsonl record, which ``attnkit report`` draws."""
    positive_int(every, "monitor every", "the steps between checks, e.g. monitor=100.")
    state: dict = {}

    def hook(trainer, record: dict) -> None:
        step = record["step"]
        if step % every and step != 1:
            return
        if "monitor" not in state:
            batch = next(iter(trainer.val_data.eval_batches(1, 1)))
            row = {"tokens": batch.inputs[:1].to(trainer.device)}  # (1, L)
            if batch.doc_ids is not None:
                row.update(doc_ids=batch.doc_ids[:1].to(trainer.device), positions=batch.positions[:1].to(trainer.device))
            state["monitor"] = AttentionMonitor(trainer.model, row, every=every, thresholds=thresholds)
        summary = state["monitor"].measure()
        record["attention"] = {layer: {"verdicts": info["verdicts"], "max_logit": info["max_logit"], **info["metrics"]}
                               for layer, info in summary.items()}

    return hook
