"""Text data for training: a byte-level tokenizer, corpora, a deterministic split by file, and packed batches.

- :class:`~attnkit.runs.tokens.ByteTokenizer`: ids 0..255 are the UTF-8 bytes, 256 is end-of-document (``EOS``); any text, no
  download.
- :func:`load_documents`: a text file, a folder of text files, or (``None``) the default corpus every machine
  has: the Python standard library's own ``.py`` sources, found through ``sysconfig`` (tests excluded).
- :func:`split_by_file`: each file goes to validation when a hash of its relative path says so: deterministic,
  and stable when files are added.
- :class:`PackedDataset`: documents (each followed by EOS) concatenated into one stream cut into rows of
  ``seq_len + 1`` tokens. :meth:`PackedDataset.batch` returns inputs, targets, the document id of every token
  (for ``document()`` masks) and positions that restart at each document; ``doc_mask=False`` turns both off
  (the classic concatenate-and-chunk GPT batch, attention across documents).

The batch of a micro-step is a pure function of ``(seed, micro_step)``: rows are visited in a permutation
seeded by ``(seed, epoch)``, so the data position of a run is just the number of micro-batches consumed.

Shape legend: B rows (batch), L seq_len, N stream tokens.
"""

from __future__ import annotations

import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnkit._checks import integer
from attnkit.errors import AttnkitValueError
from attnkit.runs.tokens import ByteTokenizer

TEXT_SUFFIXES = (".txt", ".md", ".py", ".rst", ".json", ".c", ".h", ".js", ".html", ".csv", ".tex", ".toml", ".yaml")


def stdlib_files() -> tuple[Path, list[Path]]:
    """The standard library's ``.py`` files (no site-packages, no test suites), sorted, and their root."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    files = sorted(p for p in root.rglob("*.py") if not skip.intersection(p.relative_to(root).parts))
    if not files:
        raise AttnkitValueError(f"found no .py files under the standard library folder {root}; pass data="
                                "PATH (a text file or a folder of text files) instead.")
    return root, files


def load_documents(source: str | Path | None = None) -> list[tuple[str, bytes]]:
    """``(name, bytes)`` of each document: one file, every text file under a folder, or the stdlib sources."""
    if source is None:
        root, files = stdlib_files()
    else:
        path = Path(source)
        if path.is_file():
            return [(path.name, path.read_bytes())]
        if not path.is_dir():
            raise AttnkitValueError(f"data source {str(source)!r} is neither a file nor a folder; pass a text file, a "
                                    "folder of text files, or nothing for the Python standard library corpus.")
        root = path
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
        if not files:
            raise AttnkitValueError(f"folder {str(source)!r} has no text files ({', '.join(TEXT_SUFFIXES)}); "
                                    "point data= at text.")
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in files]


def split_by_file(docs: list[tuple[str, bytes]], val_fraction: float = 0.05):
    """(train, val) lists: a document is validation when crc32(name) falls in the lowest ``val_fraction``.

    A single document is split by bytes instead (the last ``val_fraction`` of it)."""
    if not 0.0 < val_fraction < 1.0:
        raise AttnkitValueError(f"val_fraction must be in (0, 1), got {val_fraction}; use e.g. 0.05.")
    if len(docs) == 1:
        name, data = docs[0]
        cut = int(len(data) * (1 - val_fraction))
        return [(name, data[:cut])], [(name, data[cut:])]
    threshold = int(val_fraction * 2**32)
    train = [d for d in docs if zlib.crc32(d[0].encode()) >= threshold]
    val = [d for d in docs if zlib.crc32(d[0].encode()) < threshold]
    if not train or not val:  # few files: every k-th file (at least the last one) for validation
        k = min(len(docs), max(2, round(1 / val_fraction)))
        train = [d for i, d in enumerate(docs) if i % k != k - 1]
        val = [d for i, d in enumerate(docs) if i % k == k - 1]
    return train, val


@dataclass
class Batch:
    """One micro-batch: ``inputs``/``targets`` ``(B, L)`` int64, ``doc_ids``/``positions`` ``(B, L)`` or None."""

    inputs: torch.Tensor
    targets: torch.Tensor
    doc_ids: torch.Tensor | None
    positions: torch.Tensor | None

    def to(self, device) -> Batch:
        def move(t):
            return None if t is None else t.to(device, non_blocking=True)

        return Batch(move(self.inputs), move(self.targets), move(self.doc_ids), move(self.positions))


class PackedDataset:
    """Documents packed into rows of ``seq_len + 1`` tokens (inputs + shifted targets)."""

    def __init__(self, docs: list[tuple[str, bytes]], seq_len: int, *, doc_mask: bool = True,
                 eos: int = ByteTokenizer.EOS):
        integer(seq_len, "seq_len", low=2, fix="tokens per row (inputs; the targets are shifted by one).")
        pieces, ids = [], []
        for i, (_, data) in enumerate(docs):
            arr = np.frombuffer(data, dtype=np.uint8).astype(np.int16)
            pieces.append(np.append(arr, np.int16(eos)))
            ids.append(np.full(len(arr) + 1, i, dtype=np.int32))
        stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int16)  # (N,)
        self.seq_len, self.doc_mask = seq_len, doc_mask
        self.num_rows = (len(stream) - 1) // seq_len
        if self.num_rows < 1:
            raise AttnkitValueError(f"the data has {len(stream)} tokens, fewer than one row of seq_len + 1 = "
                                    f"{seq_len + 1}; use more text or a smaller seq_len=.")
        self.tokens = torch.from_numpy(stream.astype(np.int64))  # (N,)
        self.doc_index = torch.from_numpy(np.concatenate(ids)).long()  # (N,)
        self.num_tokens = len(stream)

    def rows(self, row_ids: torch.Tensor) -> Batch:
        """The rows ``row_ids`` ``(B,)``: row r covers stream tokens ``[r L, r L + L]``."""
        L = self.seq_len
        index = row_ids[:, None] * L + torch.arange(L + 1)  # (B, L+1)
        window = self.tokens[index]  # (B, L+1)
        inputs, targets = window[:, :-1], window[:, 1:]  # (B, L) each
        if not self.doc_mask:
            return Batch(inputs, targets, None, None)
        doc = self.doc_index[index[:, :-1]]  # (B, L)
        return Batch(inputs, targets, doc - doc[:, :1], restart_positions(doc))

    def order(self, seed: int, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        return torch.randperm(self.num_rows, generator=g)  # (num_rows,)

    def batch(self, micro_step: int, batch_size: int, *, seed: int, rank: int = 0, world: int = 1) -> Batch:
        """Rows of micro-batch ``micro_step`` (global batch ``batch_size``; this rank's slice of it)."""
        start = micro_step * batch_size
        ids = [self._row_at(start + j, seed) for j in range(rank * (batch_size // world),
                                                             (rank + 1) * (batch_size // world))]
        return self.rows(torch.tensor(ids))

    def _row_at(self, k: int, seed: int) -> int:
        epoch, offset = divmod(k, self.num_rows)
        cached = getattr(self, "_order", None)
        if cached is None or cached[0] != (seed, epoch):
            self._order = ((seed, epoch), self.order(seed, epoch))
        return int(self._order[1][offset])

    def eval_batches(self, batch_size: int, max_batches: int):
        """Fixed validation batches: rows in order, the first ``max_batches * batch_size`` of them."""
        n = min(self.num_rows, batch_size * max_batches)
        for start in range(0, n, batch_size):
            yield self.rows(torch.arange(start, min(start + batch_size, n)))


def restart_positions(doc_ids: torch.Tensor) -> torch.Tensor:
    """Positions that restart at 0 at each document (and at the row start): ``(B, L) -> (B, L)`` int64."""
    B, L = doc_ids.shape
    idx = torch.arange(L).expand(B, L)  # (B, L)
    new_doc = torch.ones_like(doc_ids, dtype=torch.bool)  # (B, L)
    new_doc[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    start = torch.where(new_doc, idx, torch.zeros_like(idx)).cummax(dim=1).values  # (B, L): first index of doc
    return idx - start


def unigram_loss(train: PackedDataset, batches, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of the targets of ``batches`` under the training set's unigram distribution
    (add-one smoothed): the baseline a model must beat."""
    counts = torch.bincount(train.tokens, minlength=vocab_size).double() + 1.0  # (V,)
    logp = (counts / counts.sum()).log()  # (V,)
    targets = torch.cat([b.targets.flatten() for b in batches])
    return float(-logp[targets].mean())


def data_fingerprint(docs) -> str:
    """SHA-256 over the documents' names and bytes: the identity of a run's data."""
    import hashlib

    h = hashlib.sha256()
    for name, data in docs:
        h.update(f"{len(name)}:{name}:{len(data)}:".encode())
        h.update(data)
    return h.hexdigest()
