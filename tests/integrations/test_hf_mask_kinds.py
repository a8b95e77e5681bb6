"""transformers' chunked attention reaches attnkit as a mask kind (issue 28.4): Llama 4's chunked layers give
``chunked(C, start=left_padding)``, not a custom mask probed element by element, and the model's logits equal
eager's, with left padding in a batch whose rows differ."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from attnkit._hooks import add_observer, remove_observer  # noqa: E402
from attnkit.integrations.hf import zoo  # noqa: E402


def _logits(model, ids, am):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=am).logits


@pytest.mark.parametrize("pads", [(0, 0, 0), (0, 3, 6)])
def test_llama4_chunked_layers_are_a_kind_and_equal_eager(pads):
    eager = zoo.build("llama4", attn_implementation="eager")
    model = zoo.build("llama4", attn_implementation="attnkit")
    L = 13  # > the chunk (zoo.WINDOW), so chunks really cut
    ids = torch.randint(3, 90, (3, L), generator=torch.Generator().manual_seed(0))
    am = torch.ones(3, L, dtype=torch.long)
    for row, n in enumerate(pads):
        am[row, :n] = 0
    calls = []

    def observe(call, result):
        calls.append(call)

    add_observer(observe)
    try:
        got = _logits(model, ids, am)
    finally:
        remove_observer(observe)
    want = _logits(eager, ids, am)
    real = am.bool()
    err = (got - want)[real].abs().max().item()
    assert err <= 1e-5, f"llama4: attnkit vs eager max abs diff {err:.3g}"
    leaves = [leaf for c in calls if c.prepared is not None for leaf in c.prepared.spec.leaves()]
    kinds = {leaf.kind for leaf in leaves}
    assert "chunked" in kinds and "custom" not in kinds and "dense" not in kinds, kinds
    starts = {tuple(leaf.start.tolist()) for leaf in leaves if leaf.kind == "chunked" and leaf.start is not None}
    assert starts <= {pads}, starts
