"""The HF mask's shortcuts: a call that needs less than transformers built gets less, and only then.

1. A decode step that sees every key (a dynamic cache's full and sliding layers) gets no mask and no positions.
2. A static cache run eagerly: attnkit drops the cache slots no query can reach (``HFMask.narrowed``).

Each shortcut may only serve what it proves equal: the mask passed on (narrowed masks padded back to the
cache's length with unreachable keys) must be transformers' own (``sdpa_mask`` without its skips), and generate's
logits, tokens and weights must be sdpa's / eager's. Masks nothing is proven for (sliding windows that cut,
offsets, packed rows, functions outside the vocabulary, a traced forward) are passed on as they were built.
"""

from __future__ import annotations

import pytest
import torch
from hf_tiny import VOCAB, baseline, build

from attnkit import masks
from attnkit._hooks import add_observer, remove_observer
from attnkit.errors import AttnkitValueError
from attnkit.integrations.hf.attention import _narrowed
from attnkit.integrations.hf.masks import mask_interface

tf = pytest.importorskip("transformers")
from transformers.masking_utils import (  # noqa: E402
    and_masks,
    causal_mask_function,
    sdpa_mask,
    sliding_window_causal_mask_function,
)

TOL = 1e-5
LK = 11  # the static cache's length


def _dense(mask, batch: int, total: int = LK) -> torch.Tensor:
    """An HFMask as a dense ``(B, 1, Lq, total)`` bool mask (keys past its own length: unreachable)."""
    if mask.spec is None:
        got = torch.ones(batch, 1, mask.q_len, mask.kv_len, dtype=torch.bool)
    else:
        q_pos = mask.q_len if mask.q_positions is None else mask.q_positions
        kv_pos = mask.kv_len if mask.kv_positions is None else mask.kv_positions
        got = mask.spec.to_dense(q_pos, kv_pos, batch=batch).expand(batch, 1, -1, -1)  # (B, 1, Lq, Lk)
    return torch.nn.functional.pad(got, (0, total - mask.kv_len))  # (B, 1, Lq, total): dropped keys masked


# (window or None, Lq, Lk, q_offset, kv_offset, sees every key): dynamic caches pass int offsets
EVERY_KEY_CASES = [
    (None, 1, 11, 10, 0, True),  # a decode step
    (None, 1, 11, 9, 0, False),  # keys past the query (a cache with spare slots)
    (None, 3, 11, 8, 0, False),  # a chunk of queries: causal inside it (default positions)
    (4, 1, 4, 10, 7, True),  # a sliding cache keeps the W - 1 keys the window reaches, plus the new one
    (4, 1, 5, 10, 6, False),  # one key more than the window reaches
    (4, 1, 3, 2, 0, True),  # the window is not full yet
    (4, 2, 5, 9, 6, False),  # two queries
]


@pytest.mark.parametrize("padding", [False, True])
@pytest.mark.parametrize(("window", "q_len", "kv_len", "q_offset", "kv_offset", "every"), EVERY_KEY_CASES)
def test_no_mask_only_where_every_key_is_seen(window, q_len, kv_len, q_offset, kv_offset, every, padding):
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    am = torch.ones(2, kv_offset + kv_len, dtype=torch.bool)  # (B, seen + Lq)
    if padding:
        am[1, kv_offset] = False  # row 1's oldest key of the call is padding
    built = mask_interface(2, q_len, kv_len, q_offset=q_offset, kv_offset=kv_offset, mask_function=fn,
                           attention_mask=am)
    want = sdpa_mask(batch_size=2, q_length=q_len, kv_length=kv_len, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=fn, attention_mask=am, allow_is_causal_skip=False)  # (B, 1, Lq, Lk)
    assert torch.equal(_dense(built, 2, kv_len), want)
    assert (built.spec is None) == (every and not padding), built
    if every:
        assert built.q_positions is None and built.kv_positions is None
        assert not padding or isinstance(built.spec, masks.Padding)  # the padding stays; the positional part goes


@pytest.mark.parametrize("window", [None, 4], ids=["causal", "window4"])
@pytest.mark.parametrize("padding", ["none", "left"])
@pytest.mark.parametrize(("q_len", "offset"), [(1, 0), (1, 4), (1, 9), (1, 10), (3, 0), (3, 5), (3, 8)])
def test_narrowed_mask_is_transformers_mask(q_len, offset, padding, window):
    batch = 2
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    am = torch.ones(batch, offset + q_len, dtype=torch.bool)  # (B, seen + Lq), as generate passes it
    if padding == "left":
        am[1, :2] = False
    built = mask_interface(batch, q_len, LK, q_offset=torch.tensor(offset), attention_mask=am, mask_function=fn)
    want = sdpa_mask(batch_size=batch, q_length=q_len, kv_length=LK, q_offset=offset, attention_mask=am,
                     mask_function=fn, allow_is_causal_skip=False)  # (B, 1, Lq, LK)
    narrow = built.narrowed()
    assert torch.equal(_dense(built, batch), want), "the mask as built (explicit positions) is not HF's"
    assert torch.equal(_dense(narrow, batch), want), "the narrowed mask is not HF's"
    n = offset + q_len
    assert narrow.kv_len == min(n, LK) and (narrow is built) == (n >= LK)
    if narrow is not built:
        assert narrow.q_positions is None and narrow.kv_positions is None  # attnkit's defaults: no positions
        if q_len == 1 and padding == "none" and (window is None or offset < window):
            assert narrow.spec is None  # a decode step that sees every key, without padding, needs no mask at all


def _own_overlay(b, h, q, kv):  # a model's own function: transformers' sdpa_mask evaluates it densely
    return kv != 1


@pytest.mark.parametrize("offset", [torch.tensor(4), 10], ids=["static", "dynamic"])
def test_causal_and_a_function_outside_the_vocabulary_takes_no_shortcut(offset):
    """The reader drops the unknown part of ``and_masks(causal, own)`` to a dense mask; the causal part it read
    must not pass for the whole mask."""
    fn = and_masks(causal_mask_function, _own_overlay)
    built = mask_interface(1, 1, LK, q_offset=offset, mask_function=fn)
    want = sdpa_mask(batch_size=1, q_length=1, kv_length=LK, q_offset=int(offset), mask_function=fn,
                     allow_is_causal_skip=False)  # (1, 1, 1, LK)
    assert built.dense_reason and not built.narrowable and built.narrowed() is built
    assert torch.equal(built.spec.to_dense(1, LK).expand_as(want), want)


@pytest.mark.parametrize("case", ["sliding_window_offset", "kv_offset", "dense_overlay", "dynamic_cache"])
def test_masks_the_shortcut_cannot_prove_stay_as_built(case):
    offset = torch.tensor(4)
    if case == "sliding_window_offset":  # a full sliding cache (kv_offset > 0) reads its int offsets instead
        built = mask_interface(1, 1, LK, q_offset=offset, kv_offset=1,
                               mask_function=sliding_window_causal_mask_function(3))
    elif case == "kv_offset":
        built = mask_interface(1, 1, LK, q_offset=offset, kv_offset=2)
    elif case == "dense_overlay":
        built = mask_interface(1, 1, LK, q_offset=offset, mask_function=_own_overlay)
        assert built.dense_reason
    else:
        built = mask_interface(1, 1, 5, q_offset=4)  # a dynamic cache: default positions already
    assert not built.narrowable and built.narrowed() is built


@pytest.mark.parametrize("tracer", [torch.compiler, torch.jit], ids=["compile", "jit"])
def test_a_traced_forward_keeps_the_mask_as_built(monkeypatch, tracer):
    """A traced graph must keep one structure at every decode step (no recompiles, no baked-in length)."""
    built = mask_interface(1, 1, LK, q_offset=torch.tensor(4))
    monkeypatch.setattr(tracer, "is_compiling" if tracer is torch.compiler else "is_tracing", lambda: True)
    assert built.narrowed() is built and isinstance(built.spec, masks.Causal)


def test_the_offset_is_read_from_the_positions_not_the_cache_tensor():
    """The regression: the static cache advances its offset tensor in place in the first layer's update, after the
    mask is built; read then, the narrowed mask let every query see one empty slot (logits off by ~2e-2)."""
    offset = torch.tensor(4)
    built = mask_interface(1, 1, LK, q_offset=offset)
    offset += 1  # what StaticLayer.update does
    assert built.narrowed().kv_len == 5


def test_keys_of_another_length_are_refused():
    built = mask_interface(1, 1, LK, q_offset=torch.tensor(4))
    k = torch.randn(1, 2, LK + 1, 8)
    with pytest.raises(AttnkitValueError, match=r"key has 12 positions but the attnkit mask was built for Lk=11; "
                                                r"pass the layer the mask transformers built"):
        _narrowed(built, k, k, None)


def _generate(model, ids, am, **kw):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=am, max_new_tokens=10, do_sample=False, pad_token_id=0,
                              eos_token_id=None, cache_implementation="static", return_dict_in_generate=True,
                              output_logits=True, **kw)


def _static_generate_equals_transformers(family: str, ids, am) -> list[int]:
    """Static-cache generate through attnkit against transformers' baseline: logits within TOL, same tokens.
    Returns the key count of every attnkit call, in order."""
    ref, model = build(family, baseline(family)), build(family, "attnkit")
    model.load_state_dict(ref.state_dict())
    key_lengths = []

    def observe(call, result):
        key_lengths.append(call.k.shape[2])

    want = _generate(ref, ids, am)
    add_observer(observe)
    try:
        got = _generate(model, ids, am)
    finally:
        remove_observer(observe)
    err = max((g - w).abs().max().item() for g, w in zip(got.logits, want.logits))
    assert err <= TOL, f"{family}: static-cache logits differ from {baseline(family)} by {err:.3g}"
    assert torch.equal(got.sequences, want.sequences)
    return key_lengths


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2", "gemma2"])
def test_static_cache_generate_is_narrowed_and_equals_transformers(family):
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (2, 6))
    am = torch.ones_like(ids)
    am[1, :2] = 0  # left padding in the prompt: kept as a padding mask on the narrowed keys
    key_lengths = _static_generate_equals_transformers(family, ids, am)
    # a full-attention layer's call sees only the keys up to its newest query (6 + f at forward f), not the
    # cache's 15 slots; sliding-window layers keep transformers' own sliding cache
    config = build(family).config
    layers = config.get_text_config().num_hidden_layers
    types = getattr(config, "layer_types", None) or ["full_attention"] * layers
    full = [i for i, kind in enumerate(types) if kind == "full_attention"]
    seen = [key_lengths[f * layers + i] for f in range(10) for i in full]
    assert seen == [6 + f for f in range(10) for _ in full], f"{family}: full layers' key lengths {seen}"


def test_static_sliding_layers_are_narrowed_until_their_window_fills():
    """Mistral (every layer sliding, window 5) from a 3-token prompt: a static sliding layer holds 5 slots; until
    they fill, its calls run on the keys reached so far (then transformers' offsets make every key visible)."""
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (2, 3))
    key_lengths = _static_generate_equals_transformers("mistral", ids, torch.ones_like(ids))
    assert key_lengths[::2][:3] == [3, 4, 5], key_lengths  # the first layer's calls: prefill, then two steps


def test_static_cache_weights_are_padded_back_to_the_cache_length():
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (1, 5))
    am = torch.ones_like(ids)
    ref, model = build("llama", "eager"), build("llama", "attnkit")
    model.load_state_dict(ref.state_dict())
    want = _generate(ref, ids, am, output_attentions=True).attentions
    got = _generate(model, ids, am, output_attentions=True).attentions
    for step_got, step_want in zip(got, want):
        for g, w in zip(step_got, step_want):
            assert g.shape == w.shape, (g.shape, w.shape)
            assert (g - w).abs().max().item() <= TOL


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma2"])
def test_dynamic_cache_decode_steps_pass_no_mask_on_full_and_sliding_layers(family):
    torch.manual_seed(0)
    ids = torch.randint(3, VOCAB, (1, 7))  # longer than the window: the sliding layers' caches are full
    ref, model = build(family, baseline(family)), build(family, "attnkit")
    model.load_state_dict(ref.state_dict())
    calls = []

    def observe(call, result):
        calls.append(call)

    kw = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": 0, "eos_token_id": None,
          "return_dict_in_generate": True, "output_logits": True}
    with torch.no_grad():
        want = ref.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        add_observer(observe)
        try:
            got = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kw)
        finally:
            remove_observer(observe)
    err = max((g - w).abs().max().item() for g, w in zip(got.logits, want.logits))
    assert err <= TOL and torch.equal(got.sequences, want.sequences), f"{family}: logits differ by {err:.3g}"
    decode = [c for c in calls if c.q.shape[2] == 1]
    assert decode and all(c.mask is None and c.q_positions is None for c in decode), \
        f"{family}: decode-step masks {sorted({repr(c.mask) for c in decode})}"
