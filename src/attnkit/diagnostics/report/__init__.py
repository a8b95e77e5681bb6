"""``ak.diagnostics.report``: a self-contained HTML explorer of a model's attention on one input.

>>> import attnkit as ak
>>> from attnkit.models.builders import build_lm
>>> path = ak.diagnostics.report(build_lm("nano"), "hello attention", out="report.html", doctor=False)

The page (one file, no network: script, style and data inline) shows the input tokens; a layers x heads grid
(query heads grouped by their KV head); a heatmap per head with token labels on both axes, a colour bar and the
mask drawn over it (allowed-but-unused is white, forbidden is hatched grey); hovering a token or a cell
highlights its row (where it attends) and column (what attends to it); a layer / head / verdict filter; a
sortable per-head metrics table with the collapse/uniform verdicts; the doctor's report; and, for a training
run, its loss curves (with the unigram baseline when known) and the attention monitor's verdicts; a head view (lines
from a token to the tokens it attends to); with ``compare=`` a second checkpoint's heatmap beside the model's and
their difference; with ``head_importance=`` a layers x heads importance panel. Weights are stored as bytes (step
1/255); beyond ``dense_max`` tokens each row keeps its ``top_k`` largest weights and states the mass it leaves out.

The returned path (or page) displays inline in Jupyter (:mod:`.display`). Where the page may be written, and how
(never through a link, atomically) is :mod:`.out`; every string a model or a user controls is escaped (:mod:`.page`).
"""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch
from torch import nn

from attnkit._files import check_text
from attnkit.diagnostics.report.collect import Collected, collect
from attnkit.diagnostics.report.display import ReportFile, ReportPage
from attnkit.diagnostics.report.encode import human_bytes
from attnkit.diagnostics.report.importance import check_importance_shape, importance_panel
from attnkit.diagnostics.report.out import check_out, write_page
from attnkit.diagnostics.report.page import render
from attnkit.errors import AttnkitTypeError, AttnkitValueError, describe

MAX_TOKENS = 2048  #: report(max_tokens=...) default: 2.3 GiB of weights for 12 layers x 12 heads


def byte_label(token: int) -> str:
    """A readable label for a byte-level token (0..255, 256 = EOS)."""
    if token == 256:
        return "<eos>"
    if token == 32:
        return "\u2423"
    if token == 10:
        return "\u23ce"
    if 32 < token < 127:
        return chr(token)
    return f"\\x{token:02x}"


def tokenize(model: nn.Module, text: str, tokenizer=None) -> tuple[torch.Tensor, list[str]]:
    """``(tokens (1, L), labels)`` for ``text``: a Hugging Face tokenizer if given (or found next to an HF model),
    else attnkit's byte tokenizer (attnkit models, vocab 257)."""
    if tokenizer is None and type(model).__module__.startswith("transformers."):
        path = getattr(getattr(model, "config", None), "_name_or_path", "")
        from attnkit.integrations.hf.folders import load_tokenizer

        tokenizer = load_tokenizer(path) if path else None  # never the folder's code (refused by name)
        if tokenizer is None:
            raise AttnkitValueError(f"no tokenizer found for the Hugging Face model at {path!r}; pass tokenizer=... "
                                    "or token ids instead of text.")
    if tokenizer is not None:
        ids = tokenizer(text, return_tensors="pt")["input_ids"]  # (1, L)
        return ids, [_piece(t) for t in tokenizer.convert_ids_to_tokens(ids[0].tolist())]
    from attnkit.runs.tokens import ByteTokenizer

    vocab = getattr(getattr(model, "config", None), "vocab_size", ByteTokenizer.vocab_size)
    if vocab != ByteTokenizer.vocab_size:
        raise AttnkitValueError(f"text needs a tokenizer: the model's vocab_size is {vocab}, not the byte tokenizer's "
                                f"{ByteTokenizer.vocab_size}; pass tokenizer=... or token ids.")
    ids = ByteTokenizer().encode(text)
    return torch.tensor([ids]), [byte_label(t) for t in ids]


def _piece(token: str) -> str:
    return token.replace("\u0120", "\u2423").replace("\u2581", "\u2423")


def labeler(model: nn.Module, tokenizer=None, text: bool = True):
    """``id -> label`` for tokens the report did not get labels for (generated ones): the Hugging Face tokenizer's
    piece (``tokenizer``, or the one beside an HF model when the input was text), the byte tokenizer's label for an
    attnkit model that read text, else the id itself."""
    if tokenizer is None and text and type(model).__module__.startswith("transformers."):
        path = getattr(getattr(model, "config", None), "_name_or_path", "")
        from attnkit.integrations.hf.folders import load_tokenizer

        tokenizer = load_tokenizer(path) if path else None
    if tokenizer is not None:
        return lambda t: _piece(tokenizer.convert_ids_to_tokens([int(t)])[0])
    from attnkit.runs.tokens import ByteTokenizer

    if text and getattr(getattr(model, "config", None), "vocab_size", None) == ByteTokenizer.vocab_size:
        return byte_label
    return lambda t: str(int(t))


def check_length(n_tokens: int, max_tokens: int = MAX_TOKENS) -> None:
    """Refuse an input longer than ``max_tokens`` (before anything runs), saying what it would cost."""
    if n_tokens > max_tokens:
        raise AttnkitValueError(
            f"the input has {n_tokens} tokens, more than max_tokens={max_tokens}: the report holds every layer's "
            f"weights, 4 L^2 bytes per head and layer ({human_bytes(4 * n_tokens ** 2)} per head here); shorten the "
            f"text, or pass max_tokens={n_tokens} if the memory is there.")


def shown(n_tokens: int, dense_max: int = 512, top_k: int = 32) -> str:
    """What the page shows of each head, in one sentence (the CLI prints it; the page's banner says the same)."""
    if n_tokens <= dense_max or top_k >= n_tokens:
        return f"{n_tokens} tokens: every weight of every head (1/255 steps)"
    return (f"{n_tokens} tokens > dense_max {dense_max}: each row keeps its {top_k} largest weights and states the "
            f"mass it leaves out (raise dense_max= to keep every weight)")


def _as_tokens(model, tokens, labels, tokenizer) -> tuple[torch.Tensor, list[str]]:
    if isinstance(tokens, str):
        if not tokens:
            raise AttnkitValueError("report needs a non-empty text; got ''.")
        ids, auto = tokenize(model, tokens, tokenizer)
        return ids, list(labels) if labels is not None else auto
    if isinstance(tokens, (list, tuple)):
        tokens = torch.tensor(tokens)
    if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32) or tokens.dim() not in (1, 2) \
            or (tokens.dim() == 2 and tokens.shape[0] != 1) or tokens.numel() == 0:
        raise AttnkitValueError(f"tokens must be a text, a list of ids, or an int tensor (L,) or (1, L), got "
                                f"{describe(tokens)}; the report shows one sequence.")
    tokens = tokens.reshape(1, -1).long()  # (1, L)
    if labels is None:
        labels = [str(t) for t in tokens[0].tolist()]
    if len(labels) != tokens.shape[1]:
        raise AttnkitValueError(f"labels has {len(labels)} entries but there are {tokens.shape[1]} tokens; give one "
                                "label per token.")
    return tokens, [str(x) for x in labels]


def trained_length(model: nn.Module) -> int | None:
    """The longest input the model was built (trained) for: an attnkit config's ``max_seq_len`` or a Hugging Face
    config's ``max_position_embeddings`` / ``n_positions``; None when the model does not say."""
    config = getattr(model, "config", None)
    for attr in ("max_seq_len", "max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _length_warning(model: nn.Module, n_tokens: int) -> str | None:
    limit = trained_length(model)
    if limit is None or n_tokens <= limit:
        return None
    message = (f"the text has {n_tokens} tokens, more than the {limit} {type(model).__name__} was built for "
               f"(its config's trained length): attention past position {limit} is extrapolation, not what the model "
               "learned; shorten the text to compare with its training.")
    warnings.warn(message, stacklevel=3)
    return message


def _collect_compare(compare: nn.Module, ids: torch.Tensor, labels: list[str], data: Collected, thresholds) -> Collected:
    """The second checkpoint's attention on the same tokens; it must have the same layers and heads."""
    if not isinstance(compare, nn.Module):
        raise AttnkitTypeError(f"report(compare=...) must be a torch.nn.Module (another checkpoint of the same model), "
                               f"got {describe(compare)}.")
    other = collect(compare, ids.to(next(iter(compare.parameters()), torch.empty(0)).device), labels,
                    thresholds=thresholds)
    shape_a = [(x.name, x.num_heads) for x in data.layers]
    shape_b = [(x.name, x.num_heads) for x in other.layers]
    if shape_a != shape_b:
        raise AttnkitValueError(f"compare has other attention layers than model ({shape_b} vs {shape_a}, as (layer, "
                                "heads)); compare two checkpoints of one model (e.g. before and after training).")
    for a, b in zip(data.layers, other.layers):  # the page draws both with the model's mask: it must be theirs
        if (a.allowed is None) != (b.allowed is None) or (a.allowed is not None and not torch.equal(a.allowed, b.allowed)):
            raise AttnkitValueError(f"compare's attention mask in {b.name} differs from model's on the same tokens; "
                                    "compare two checkpoints of one model (same mask, window and positions).")
    return other


def _check_options(model, tokens, title, doctor, names, **positive) -> bool | dict:
    """Refuse bad arguments before anything runs; returns ``doctor`` as True, False or a dict."""
    if not isinstance(model, nn.Module):
        raise AttnkitTypeError(f"report(model=...) must be a torch.nn.Module, got {describe(model)}.")
    hints = {"top_k": "weights kept per row past dense_max; e.g. 32", "dense_max": "longest input stored densely; e.g. 512",
             "max_tokens": f"longest input accepted; default {MAX_TOKENS}"}
    for name, value in positive.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AttnkitValueError(f"{name} must be a positive int ({hints[name]}), got {describe(value)}.")
    if doctor is not True and doctor is not False and not isinstance(doctor, dict):
        doctor = doctor.to_dict() if hasattr(doctor, "to_dict") else doctor
        if not isinstance(doctor, dict):
            raise AttnkitTypeError(f"doctor must be True, False, a doctor Report or its to_dict(), got {describe(doctor)}.")
    for name, value in (("title", title), ("tokens", tokens)):
        if isinstance(value, str):
            check_text(name, value)
    if not (isinstance(names, (tuple, list)) and len(names) == 2 and all(isinstance(n, str) for n in names)):
        raise AttnkitTypeError(f"names must be two strings (the model's and compare's), got {describe(names)}.")
    return doctor


def _facts(model: nn.Module, data: Collected) -> str:
    """The header line: the model's class, layers x heads (KV heads), parameters, tokens, where the weights came from."""
    n_params = sum(p.numel() for p in model.parameters())
    first = data.layers[0]
    return (f"{type(model).__name__}: {len(data.layers)} layers x {first.num_heads} heads"
            + (f" ({first.kv_heads} KV heads)" if first.kv_heads != first.num_heads else "")
            + f", {n_params / 1e6:.2f} M parameters; {len(data.labels)} tokens; weights from {data.source}; "
            f"written {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by attnkit")


def report(model: nn.Module, tokens, *, out: str | Path | None = "attention_report.html", overwrite: bool = False,
           labels=None, tokenizer=None, title: str | None = None, doctor: bool | dict = True, fresh: bool | None = None,
           metrics: str | Path | list | None = None, dense_max: int = 512, top_k: int = 32,
           max_tokens: int = MAX_TOKENS, thresholds=None, compare: nn.Module | None = None,
           names: tuple[str, str] = ("model", "compare"), head_importance=None,
           baseline: float | None = None, generate: int | None = None, label_of=None) -> ReportFile | ReportPage:
    """Write the HTML attention report of ``model`` on ``tokens`` and return its path (or the HTML when ``out``
    is None). Either displays the page inline in Jupyter (``_repr_html_``: a sandboxed iframe).

    Args:
        model: an attnkit model (any module whose attention goes through ``attnkit.attention``) or a Hugging Face
            model (eager attention).
        tokens: a text (tokenized by ``tokenizer``, the HF model's tokenizer, or the byte tokenizer), a list of
            ids or an int tensor ``(L,)``/``(1, L)``.
        out: the ``.html`` to write. Refused (before the model runs, see :func:`~.out.check_out`): a name without
            ``.html``, a folder, a symbolic link, anything not a regular file (a FIFO), and an existing file that is
            not an attnkit report unless ``overwrite`` (which also replaces a link itself, never its target). The
            page is written to a temporary file and renamed: a failed write keeps the earlier report.
        labels: one label per token (default: the tokenizer's pieces or the ids).
        doctor: run ``ak.doctor.examine`` on the model and include its report (or pass a ``Report`` / its dict).
        fresh: tells the doctor whether the weights are new (see ``examine``).
        metrics: a ``metrics.jsonl`` path (or its records) for the training curves and monitor verdicts.
        baseline: the unigram baseline loss (nats/token) drawn on the loss chart (default: a record's
            ``unigram_loss`` if the metrics have one).
        dense_max, top_k: sequences longer than ``dense_max`` keep the ``top_k`` largest weights per row (the
            page says so and states each row's remaining mass; :func:`shown` is the sentence).
        max_tokens: longer inputs are refused before the model runs: the report holds every layer's
            ``(H, L, L)`` float32 weights (``4 L**2`` bytes per head and layer: 2.3 GiB for 12 x 12 heads at
            2048 tokens, 9 GiB at 4096). Raise it knowingly.
        compare: a second checkpoint of the same model (e.g. before training): the page shows its heatmap beside
            the model's for the open head. ``names`` labels the two.
        head_importance: an object with ``.scores`` ``(layers, heads)``, ``.objective``, ``.ablation`` and
            ``.baseline`` (``ak.diagnostics.head_importance``), drawn as a layers x heads panel.
        generate: continue the text greedily for this many tokens and show, for each new token, which earlier
            tokens the query that produced it attended to, in every layer and head (:mod:`.generated`; a causal LM;
            the text plus the new tokens within ``max_tokens``). ``label_of(id) -> str`` labels the new tokens
            (default :func:`labeler`).
    """
    doctor = _check_options(model, tokens, title, doctor, names, top_k=top_k, dense_max=dense_max,
                            max_tokens=max_tokens)
    if out is not None:
        out = check_out(out, overwrite)  # before the model runs: a typo costs nothing
    importance = importance_panel(head_importance)
    ids, labels = _as_tokens(model, tokens, labels, tokenizer)
    check_length(ids.shape[1], max_tokens)
    if generate is not None:
        from attnkit.diagnostics.report.generated import check_generate

        check_generate(model, generate, ids.shape[1], max_tokens)  # before anything runs
    length_warning = _length_warning(model, ids.shape[1])
    ids = ids.to(next(iter(model.parameters()), torch.empty(0)).device)
    data: Collected = collect(model, ids, labels, thresholds=thresholds)
    other = None if compare is None else _collect_compare(compare, ids, labels, data, thresholds)
    generated = None
    if generate is not None:
        from attnkit.diagnostics.report.generated import collect_generated

        generated = collect_generated(model, ids, generate, label_of or labeler(model, tokenizer, isinstance(tokens, str)))
    if importance is not None:
        check_importance_shape(importance, data)
    doctor_dict = doctor if isinstance(doctor, dict) else None
    if doctor is True:
        from attnkit.diagnostics.doctor import examine

        doctor_dict = examine(model, fresh=fresh, name=title or type(model).__name__, text=ids, thresholds=thresholds,
                              text_note=f"the report's text, {ids.shape[1]} tokens").to_dict()
    records = metrics
    if isinstance(metrics, (str, Path)):
        from attnkit.runs.read import read_metrics

        records = read_metrics(metrics)
    page = render(data, title=title or f"attnkit report: {type(model).__name__}", facts=_facts(model, data),
                  doctor=doctor_dict,
                  records=records, dense_max=dense_max, top_k=top_k, thresholds=thresholds, compare=other,
                  names=tuple(names), importance=importance, warning=length_warning, baseline=baseline,
                  generated=generated)
    if out is None:
        return ReportPage(page)
    return ReportFile(write_page(out, page))


__all__ = ["report", "tokenize", "labeler", "byte_label", "collect", "shown", "check_length", "check_out", "trained_length",
           "ReportFile", "ReportPage", "MAX_TOKENS"]
