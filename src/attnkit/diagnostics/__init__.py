"""Attention diagnostics: weights from any backend, per-head health metrics, a training monitor and the doctor.

- :class:`capture`: record attention probabilities (and q, k, scores) per layer/head/row, whatever the backend;
- :func:`head_metrics`, :class:`HealthThresholds`: entropy, max probability, sink mass, distance, masked mass,
  and the collapsed / uniform / healthy verdicts;
- :class:`AttentionMonitor`: a training callback that logs them and warns on collapse, uniformity or logit growth;
- :func:`examine` (also ``ak.doctor.examine``): the pitfall checklist as automatic checks, a :class:`Report`;
- :func:`report`: a self-contained HTML explorer of the attention of a model on one input (``attnkit report``);
- :class:`ablate`, :class:`record_heads`, :class:`patch`: remove heads, or patch them from another input, on any backend;
  :func:`head_importance`: rank heads by the loss change when each is removed (``attnkit heads``).
"""

from attnkit.diagnostics.ablation import ablate, patch, record_heads
from attnkit.diagnostics.capture import Record, capture
from attnkit.diagnostics.doctor import CheckResult, Report, examine
from attnkit.diagnostics.importance import HeadImportance, head_importance
from attnkit.diagnostics.metrics import HeadMetrics, HealthThresholds, head_metrics, record_metrics, verdict
from attnkit.diagnostics.monitor import AttentionHealthWarning, AttentionMonitor
from attnkit.diagnostics.report import report
from attnkit.diagnostics.subjects import Subject, TokenAdapter, make_subject

__all__ = [
    "capture", "Record", "examine", "Report", "CheckResult", "head_metrics", "record_metrics", "verdict",
    "HeadMetrics", "HealthThresholds", "AttentionMonitor", "AttentionHealthWarning", "TokenAdapter", "Subject",
    "make_subject", "report", "ablate", "record_heads", "patch", "head_importance", "HeadImportance",
]
