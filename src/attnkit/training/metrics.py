"""Run outputs: metrics as JSONL (one record per line, floats exact) and the loss-curve PNG."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from attnkit.runs.read import read_metrics  # (defined with the run reader: the report reads metrics too)
from attnkit.runs.write import replacing


class MetricsWriter:
    """Append records to ``metrics.jsonl``; on resume keep only records up to the resumed step.

    :meth:`fingerprint` (the record count and a SHA-256 of the lines written so far) goes into every
    checkpoint, so a resume notices a history that was cut or edited (:meth:`verify`).
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None):
        self.path = Path(path)
        self._hash, self._count = hashlib.sha256(), 0
        kept = []
        if resume_step is not None:
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
        if self.path.exists() or self.path.is_symlink():
            self.path.unlink()
        self._file = open(self.path, "a")  # noqa: SIM115 - open for the whole run, closed by close()
        for record in kept:
            self.write(record)

    def write(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        self._file.write(line)
        self._file.flush()
        self._hash.update(line.encode())
        self._count += 1

    def fingerprint(self) -> dict:
        return {"records": self._count, "sha256": self._hash.hexdigest()}

    def verify(self, expected: dict | None) -> str | None:
        """None when the kept history matches a checkpoint's fingerprint, else what is wrong (for a warning)."""
        if not expected:
            return None
        got = self.fingerprint()
        if got["records"] < expected["records"]:
            return (f"has {got['records']} records up to this checkpoint, the checkpoint recorded {expected['records']}: "
                    f"{expected['records'] - got['records']} were lost (the file was cut or replaced)")
        if got != expected:
            return "differs from the history this checkpoint recorded (the file was edited)"
        return None

    def close(self) -> None:
        self._file.close()


def plot_loss(metrics_path: str | Path, out_path: str | Path, baseline: float | None = None) -> Path:
    """Train loss per step and validation loss per eval, with the unigram baseline, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    train = [(r["step"], r["loss"]) for r in records if "loss" in r]
    val = [(r["step"], r["val_loss"]) for r in records if "val_loss" in r]
    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        ax.plot(*zip(*train), label="train loss", lw=1)
    if val:
        ax.plot(*zip(*val), "o-", label="validation loss")
    if baseline is not None:
        ax.axhline(baseline, color="gray", ls="--", label=f"unigram baseline {baseline:.2f}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with replacing(out_path) as f:  # a symlinked loss.png is replaced, never written through
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return Path(out_path)
