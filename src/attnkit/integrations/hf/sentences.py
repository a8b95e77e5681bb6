"""Sentence embeddings from a Hugging Face encoder, pooled as sentence-transformers pools them.

>>> from attnkit.integrations.hf.sentences import load_encoder, embed
>>> model, tokenizer = load_encoder(path)                        # attn_implementation="attnkit"  # doctest: +SKIP
>>> vectors = embed(model, tokenizer, ["a sentence", "another"])  # (N, E), unit length          # doctest: +SKIP

Mean pooling over the real tokens (padding excluded), then L2 normalisation: sentence-transformers'
``Pooling(pooling_mode_mean_tokens=True)`` followed by ``Normalize()``, as all-MiniLM-L6-v2 is configured.

Shape legend: N sentences, L padded length, E hidden size.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from attnkit._checks import positive_int
from attnkit.errors import AttnkitValueError


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the real tokens' hidden states: ``(N, L, E), (N, L) -> (N, E)`` (sentence-transformers' rule,
    token count clamped at 1e-9)."""
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)  # (N, L, 1)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # (N, E)


def load_encoder(path: str | Path, *, attn_implementation: str = "attnkit", dtype: torch.dtype = torch.float32):
    """``(model, tokenizer)`` of the Hugging Face encoder folder ``path`` (``AutoModel`` and ``AutoTokenizer``),
    in eval mode; the attention implementation defaults to attnkit. Never runs code from the folder, and refuses
    weight files that are incomplete or unreadable (:func:`~attnkit.integrations.hf.folders.load_pretrained`)."""
    import attnkit.integrations.hf  # noqa: F401  (registers "attnkit")
    from attnkit.integrations.hf._deps import transformers
    from attnkit.integrations.hf.folders import load_pretrained, load_tokenizer
    from attnkit.integrations.remote_code import read_config

    tf = transformers()
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise AttnkitValueError(f"path={str(path)!r} is not a Hugging Face model folder (no config.json); pass the "
                                "folder that holds config.json, the weights and the tokenizer.")
    read_config(folder)  # refuses auto_map (custom code) before transformers sees the folder
    model = load_pretrained(tf.AutoModel, folder, optional=("pooler.",), attn_implementation=attn_implementation,
                            dtype=dtype)
    tokenizer = load_tokenizer(folder)  # refuses a tokenizer that asks for the folder's code
    if tokenizer is None:
        raise AttnkitValueError(f"path={str(path)!r} has no tokenizer files; pass the folder that holds config.json, "
                                "the weights and the tokenizer.")
    return model, tokenizer


def max_length(path: str | Path) -> int | None:
    """The truncation length sentence-transformers uses for the folder (``sentence_bert_config.json``), if any."""
    config = Path(path) / "sentence_bert_config.json"
    return json.loads(config.read_text()).get("max_seq_length") if config.is_file() else None


def embed(model, tokenizer, sentences: list[str], *, normalize: bool = True, truncate_to: int | None = None,
          batch_size: int | None = None):
    """Unit-length sentence vectors ``(N, E)`` of ``sentences``, in their order.

    ``batch_size=None`` runs one right-padded batch. With a ``batch_size``, sentences are sorted by token count
    (longest first, as sentence-transformers' ``encode`` does) and run ``batch_size`` at a time, so each batch is
    padded only to its own longest sentence; the vectors come back in the order given.
    """
    if isinstance(sentences, str) or not sentences:
        raise AttnkitValueError(f"sentences must be a non-empty list of strings, got {sentences!r}; wrap a single "
                                "sentence in a list.")
    if batch_size is not None:
        positive_int(batch_size, "batch_size", "or None (one batch); e.g. batch_size=32.")
    sentences = list(sentences)
    if batch_size is None or batch_size >= len(sentences):
        return _embed_batch(model, tokenizer, sentences, normalize, truncate_to)
    counts = [len(ids) for ids in tokenizer(sentences, truncation=truncate_to is not None,
                                            max_length=truncate_to)["input_ids"]]
    order = sorted(range(len(sentences)), key=lambda i: -counts[i])
    parts = [_embed_batch(model, tokenizer, [sentences[i] for i in order[start:start + batch_size]], normalize,
                          truncate_to) for start in range(0, len(order), batch_size)]
    out = parts[0].new_empty(len(sentences), parts[0].shape[1])  # (N, E)
    out[torch.tensor(order, device=out.device)] = torch.cat(parts)  # back to the caller's order
    return out


def _embed_batch(model, tokenizer, sentences: list[str], normalize: bool, truncate_to: int | None) -> torch.Tensor:
    """``(N, E)`` vectors of one right-padded batch."""
    batch = tokenizer(sentences, padding=True, truncation=truncate_to is not None, max_length=truncate_to,
                      return_tensors="pt")
    batch = {k: v.to(next(model.parameters()).device) for k, v in batch.items()}
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state  # (N, L, E)
    pooled = mean_pool(hidden, batch["attention_mask"])  # (N, E)
    return F.normalize(pooled, p=2, dim=1) if normalize else pooled
