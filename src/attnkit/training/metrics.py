"""Run outputs: metrics as JSONL (one record per line, floats exact) and the loss-curve PNG."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from attnkit.runs.read import read_metrics  # (defined with the run reader: the report reads metrics too)
from attnkit.runs.write import replacing, writing


class MetricsWriter:
    """Append records to ``metrics.jsonl``; on resume keep every intact record up to the resumed step (a line that
    is not a record is skipped with a warning through ``log``; the others are never dropped).

    :meth:`fingerprint` (the record count and a SHA-256 of the lines written so far) goes into every
    checkpoint, so a resume notices a history that was cut or edited (:meth:`verify`).
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, log=print):
        self.path = Path(path)
        self._hash, self._count = hashlib.sha256(), 0
        kept = []
        if resume_step is not None:  # every intact record up to the checkpoint; a bad line is skipped, said
            kept = [r for r in read_metrics(self.path, on_skip=lambda m: log(f"WARNING: {m}"))
                    if r["step"] <= resume_step]
        with replacing(self.path) as f:  # the kept history replaces the file at once: a kill leaves one or the other
            f.write("".join(self._line(r) for r in kept).encode())
        with writing(self.path):
            self._file = open(self.path, "a")  # noqa: SIM115 - open for the whole run, closed by close()
        for record in kept:
            self._count_line(self._line(record))

    @staticmethod
    def _line(record: dict) -> str:
        return json.dumps(record) + "\n"

    def _count_line(self, line: str) -> None:
        self._hash.update(line.encode())
        self._count += 1

    def write(self, record: dict) -> None:
        line = self._line(record)
        with writing(self.path):  # disk full: a typed error naming the file (a cut last line is skipped on reading)
            self._file.write(line)
            self._file.flush()
        self._count_line(line)

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
