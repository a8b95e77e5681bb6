"""torch.compile over a Hugging Face model with attn_implementation="attnkit": fullgraph, static cache.

Copies of transformers' own ``test_generate_compile_model_forward_fullgraph`` (greedy ``generate`` compiled by
transformers itself: ``CompileConfig(fullgraph=True, dynamic=False)`` over a static cache, tokens equal to the
eager run with a dynamic cache, no recompile across decode steps) and ``test_static_cache_no_recompile_with_
smaller_length`` (a second compiled generate with a shorter prompt reuses the graphs), on tiny configs.
``fullgraph=True`` makes any graph break an error; ``error_on_recompile`` makes any recompile one. Gemma 2's
sliding layers make transformers' own sliding cache recompile (an int read per step, with every implementation,
which transformers' test tolerates), so for it the test asks for the full graph and the tokens.

Compiling takes 10-40 s per family on 2 cores: few, tiny models (2 layers, hidden 32).
"""

from __future__ import annotations

import pytest
import torch
from hf_tiny import build

tf = pytest.importorskip("transformers")

PROMPT = 7
NEW = 5
NO_SLIDING = {"qwen2": {"use_sliding_window": False}}


def _compiled_generate_kwargs():
    config = tf.CompileConfig(fullgraph=True, dynamic=False)
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told (the CPU here)
    return {"use_cache": True, "do_sample": False, "max_new_tokens": NEW, "pad_token_id": 0, "eos_token_id": None,
            "compile_config": config}


def _prompts(batch: int = 2, length: int = PROMPT):
    ids = torch.randint(3, 96, (batch, length))
    return ids, torch.ones_like(ids)


def _recompiles_are_errors(family: str):
    sliding = family == "gemma2"  # transformers' sliding cache layers recompile with every implementation
    return torch._dynamo.config.patch(error_on_recompile=not sliding)


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "gemma2"])
def test_generate_compile_model_forward_fullgraph(family):
    model = build(family, "attnkit", **NO_SLIDING.get(family, {}))
    inputs = [_prompts(), _prompts()]
    kw = _compiled_generate_kwargs()
    torch.compiler.reset()
    with torch.no_grad(), torch.compiler.set_stance("force_eager"):
        want = [model.generate(input_ids=ids, attention_mask=am, **kw) for ids, am in inputs]
    with torch.no_grad(), _recompiles_are_errors(family):
        got = [model.generate(input_ids=ids, attention_mask=am, cache_implementation="static", **kw)
               for ids, am in inputs]
    assert hasattr(model, "_compiled_call"), f"{family}: generate did not compile the forward"
    for g, w in zip(got, want):
        assert torch.equal(g, w), f"{family}: compiled tokens differ at {(g != w).nonzero()[:5].tolist()}"


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_static_cache_no_recompile_with_smaller_length(family):
    """A second compiled generate with a shorter prompt (same cache size) reuses the compiled decode graph (no
    recompile in either generate); its tokens equal the eager run's."""
    model = build(family, "attnkit")
    kw = {**_compiled_generate_kwargs(), "cache_implementation": "static", "max_length": PROMPT + NEW}
    kw.pop("max_new_tokens")
    long_ids, long_am = _prompts(length=PROMPT)
    short_ids, short_am = _prompts(length=PROMPT - 2)
    torch.compiler.reset()
    with torch.no_grad():
        with _recompiles_are_errors(family):
            model.generate(input_ids=long_ids, attention_mask=long_am, **kw)
            got = model.generate(input_ids=short_ids, attention_mask=short_am, **kw)
        with torch.compiler.set_stance("force_eager"):
            want = model.generate(input_ids=short_ids, attention_mask=short_am, **kw)
    assert got.shape == (2, PROMPT + NEW)
    assert torch.equal(got, want), f"{family}: {(got != want).nonzero()[:5].tolist()}"
