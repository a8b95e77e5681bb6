"""attn_implementation="attnkit" against transformers' own eager/sdpa attention, on tiny configs of each family.

Compared on real tokens only (a padding query's output is undefined in every implementation), fp32, max abs
diff <= 1e-5 as the issue asks.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hf_tiny import DECODERS, FAMILIES, VOCAB, WINDOW, baseline, build

from attnkit import masks
from attnkit._hooks import add_observer, remove_observer
from attnkit.errors import AttnkitTypeError, BackendUnsupportedError
from attnkit.integrations.hf import set_backend

TOL = 1e-5
L = 13  # > WINDOW


def _batch(padding: str, batch: int = 3, length: int = L):
    ids = torch.randint(3, VOCAB, (batch, length))
    am = torch.ones(batch, length, dtype=torch.long)
    for row, n_pad in enumerate([0, 4, 7][:batch]):
        if n_pad and padding == "right":
            am[row, length - n_pad:] = 0
        elif n_pad and padding == "left":
            am[row, :n_pad] = 0
    ids = ids.masked_fill(am == 0, 0)
    return ids, am


def _out(model, ids, am, **kw):
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=am, **kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


class Seen:
    """Records the attnkit calls (their masks and positions) made while it is active."""

    def __init__(self):
        self.calls = []

    def __enter__(self):
        add_observer(self._observe)
        return self

    def __exit__(self, *exc):
        remove_observer(self._observe)

    def _observe(self, call, result):
        self.calls.append(call)


def _kinds(spec) -> set[str]:
    if spec is None:
        return set()
    if isinstance(spec, (masks.And, masks.Or)):
        return set().union(*(_kinds(p) for p in spec.parts))
    return {type(spec).__name__}


def _compare(family: str, ids, am, **kw):
    ref_model = build(family, baseline(family))
    model = build(family, "attnkit")
    model.load_state_dict(ref_model.state_dict())
    with Seen() as seen:
        want = _out(ref_model, ids, am, **kw)
    assert not seen.calls, f"{family}: the {baseline(family)} reference ran through attnkit"
    with Seen() as seen:
        got = _out(model, ids, am, **kw)
    real = am.bool()
    err = (got - want)[real].abs().max().item()
    assert err <= TOL, f"{family}: attnkit vs {baseline(family)} max abs diff {err:.3g} > {TOL}"
    assert seen.calls, f"{family}: no attention call reached attnkit"
    return seen.calls


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_matches_transformers(family, padding):
    ids, am = _batch(padding)
    calls = _compare(family, ids, am)
    kinds = set().union(*(_kinds(c.mask) for c in calls))
    assert "Padding" in kinds, f"{family}: padding did not reach attnkit as a padding mask: {kinds}"
    assert "Dense" not in kinds, f"{family}: a mask reached attnkit as a dense tensor: {kinds}"
    if family in ("mistral", "qwen2", "gemma2"):
        windows = {p.window for c in calls for p in _parts(c.mask) if isinstance(p, masks.SlidingWindow)}
        assert windows == {WINDOW}, f"{family}: sliding window did not reach attnkit as a window: {kinds}"


def _parts(spec):
    if isinstance(spec, (masks.And, masks.Or)):
        for p in spec.parts:
            yield from _parts(p)
    elif spec is not None:
        yield spec


def test_gemma2_alternates_window_and_full_layers_with_softcap():
    ids, am = _batch("right")
    calls = _compare("gemma2", ids, am)
    windows = [any(isinstance(p, masks.SlidingWindow) for p in _parts(c.mask)) for c in calls]
    assert windows == [True, False], f"Gemma 2 layer types are sliding, full; attnkit saw windows {windows}"
    assert {c.softcap for c in calls} == {5.0}, "Gemma 2's attention softcap did not reach attnkit"


def test_qwen2_sliding_layers_from_max_window_layers():
    calls = _compare("qwen2", *_batch("left"))
    windows = [any(isinstance(p, masks.SlidingWindow) for p in _parts(c.mask)) for c in calls]
    assert windows == [False, True, True], f"Qwen2 windows by layer: {windows}"


def test_gqa_keys_reach_attnkit_unrepeated():
    calls = _compare("llama", *_batch("right"))
    assert {(c.num_heads, c.num_kv_heads) for c in calls} == {(4, 2)}


def test_rope_scaling_beyond_original_context():
    length = 40  # original_max_position_embeddings = 8
    ids, am = _batch("right", length=length)
    _compare("llama-rope-scaled", ids, am)


def test_no_padding_plain_causal_is_a_causal_mask_on_default_positions():
    ids, am = _batch("right", batch=1)
    calls = _compare("llama", ids, am)
    assert all(isinstance(c.mask, masks.Causal) and c.default_positions for c in calls)


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_packed_rows_equal_separate_sequences(family):
    """Position ids that restart mark packed documents: each must see only itself, as if run alone."""
    lengths = [4, 6, 3]
    ids = torch.randint(3, VOCAB, (1, sum(lengths)))
    position_ids = torch.cat([torch.arange(n) for n in lengths])[None]
    model = build(family, "attnkit")
    with torch.no_grad(), Seen() as seen:
        packed = model(input_ids=ids, position_ids=position_ids, use_cache=False).logits  # HF packs without a cache
        model.set_attn_implementation("eager")
        start, pieces = 0, []
        for n in lengths:
            pieces.append(model(input_ids=ids[:, start:start + n]).logits)
            start += n
    separate = torch.cat(pieces, dim=1)
    err = (packed - separate).abs().max().item()
    assert err <= TOL, f"{family}: packed rows through attnkit vs separate eager runs: {err:.3g}"
    assert any("Document" in _kinds(c.mask) for c in seen.calls), "packing did not reach attnkit as documents"


@pytest.mark.parametrize("family", DECODERS)
def test_greedy_generate_matches_sdpa(family):
    ids, am = _batch("left", batch=2, length=7)
    ref_model = build(family, baseline(family))
    model = build(family, "attnkit")
    model.load_state_dict(ref_model.state_dict())
    if family == "gemma2":  # softcap routes to flex on CPU, which compiles once per decode length (minutes)
        set_backend(model, "math")
    kw = {"max_new_tokens": 32, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    with torch.no_grad():
        want = ref_model.generate(input_ids=ids, attention_mask=am, **kw)
        got = model.generate(input_ids=ids, attention_mask=am, **kw)
    assert got.shape == want.shape == (2, 7 + 32)
    assert torch.equal(got, want), f"{family}: greedy tokens differ at {(got != want).nonzero()[:5].tolist()}"


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "gpt2", "gemma2"])
def test_greedy_generate_with_a_static_cache_matches_sdpa(family):
    """The regression: generate builds the mask once per step through the mask interface and hands it back as
    attention_mask; the interface took it for a 2-D padding mask and crashed."""
    ids, am = _batch("left", batch=2, length=7)
    ref_model = build(family, baseline(family))
    model = build(family, "attnkit")
    model.load_state_dict(ref_model.state_dict())
    kw = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": 0, "eos_token_id": None,
          "cache_implementation": "static"}
    with torch.no_grad():
        want = ref_model.generate(input_ids=ids, attention_mask=am, **kw)
        with Seen() as seen:
            got = model.generate(input_ids=ids, attention_mask=am, **kw)
    assert seen.calls and torch.equal(got, want), f"{family}: {(got != want).nonzero()[:5].tolist()}"


def test_a_prepared_mask_for_other_sizes_is_refused():
    from attnkit.errors import AttnkitValueError
    from attnkit.integrations.hf.masks import HFMask, mask_interface

    built = HFMask(masks.causal(), None, None, q_len=1, kv_len=8)
    assert mask_interface(1, 1, 8, attention_mask=built) is built
    with pytest.raises(AttnkitValueError, match=r"attention_mask is an attnkit mask built for Lq=1, Lk=8 but this call "
                                                r"has Lq=2, Lk=9; pass the 2-D padding mask"):
        mask_interface(1, 2, 9, attention_mask=built)


def test_existing_model_switches_and_explains():
    import attnkit as ak

    model = build("mistral", "sdpa")
    model.set_attn_implementation("attnkit")
    ids, am = _batch("right", batch=2)
    with Seen() as seen:
        _out(model, ids, am)
    call = seen.calls[0]
    text = str(ak.explain(call.q, call.k, call.v, call.mask, q_positions=call.q_positions,
                          kv_positions=call.kv_positions))
    assert "sliding_window(5)" in text and "padding" in text, text


def test_output_attentions_returns_attnkit_weights():
    model = build("llama", "attnkit")
    ref = build("llama", "eager")
    ref.load_state_dict(model.state_dict())
    ids, am = _batch("right", batch=2)
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=am, output_attentions=True).attentions
        want = ref(input_ids=ids, attention_mask=am, output_attentions=True).attentions
    for g, w in zip(got, want):
        real = am.bool()[:, None, :, None].expand_as(g)
        err = (g - w)[real].abs().max().item()
        assert err <= TOL, f"weights differ by {err:.3g}"


def test_unknown_mask_function_is_exact_but_dense_with_a_reason():
    from transformers.masking_utils import create_causal_mask

    model = build("llama", "attnkit")
    embeds = torch.randn(1, 6, 32)

    def first_token_global(b, h, q, kv):  # an overlay outside transformers' vocabulary
        return kv == 0

    mask = create_causal_mask(model.config, embeds, None, None, or_mask_function=first_token_global)
    assert mask.dense_reason and "first_token_global" in mask.dense_reason
    want = torch.tril(torch.ones(6, 6, dtype=torch.bool))
    want[:, 0] = True
    assert torch.equal(mask.spec.to_dense(6)[0, 0], want)


def test_per_call_window_size_is_refused():
    from attnkit.integrations.hf import attention_forward

    q = k = v = torch.randn(1, 2, 3, 4)
    with pytest.raises(BackendUnsupportedError, match=r"window_size=\(2, 2\)"):
        attention_forward(torch.nn.Module(), q, k, v, None, window_size=(2, 2))


def test_foreign_mask_object_is_a_type_error():
    from attnkit.integrations.hf import attention_forward

    q = k = v = torch.randn(1, 2, 3, 4)
    with pytest.raises(AttnkitTypeError, match="attention_mask must be what the 'attnkit' mask interface builds"):
        attention_forward(torch.nn.Module(), q, k, v, [[1, 1, 1]])


def test_user_4d_masks_bool_and_float():
    from attnkit.functional.reference import reference_attention
    from attnkit.integrations.hf import attention_forward

    q, k, v = (torch.randn(2, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    allowed = torch.rand(2, 1, 5, 5) > 0.3
    allowed[..., 0] = True
    out, _ = attention_forward(torch.nn.Module(), q, k, v, allowed)
    want = reference_attention(q, k, v, allowed)
    assert (out.transpose(1, 2) - want).abs().max() < 1e-12
    q, k, v = q.float(), k.float(), v.float()
    additive = torch.where(allowed, 0.0, torch.finfo(torch.float32).min)  # as transformers' eager_mask builds it
    out, _ = attention_forward(torch.nn.Module(), q, k, v, additive)
    err = (out.transpose(1, 2).double() - want).abs().max().item()
    assert err < 1e-5, f"additive 4-D mask: {err:.3g}"


def test_gpt_oss_sinks_through_attnkit_equal_eager():
    """gpt-oss passes its learned sink logits (s_aux) to every attention call: served (math), equal to eager."""
    from hf_tiny import tf

    cfg = tf.GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                          num_experts_per_tok=1, sliding_window=4, max_position_embeddings=64,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    ref = tf.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for layer in ref.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)  # sinks that take real mass (they start at 0)
    ref.set_attn_implementation("eager")
    model = tf.GptOssForCausalLM(copy.deepcopy(cfg)).eval()  # its own config: set_attn_implementation writes there
    model.load_state_dict(ref.state_dict())
    model.set_attn_implementation("attnkit")
    ids = torch.randint(0, VOCAB, (2, 9))
    with torch.no_grad(), Seen() as seen:
        want = ref(ids).logits
        assert not seen.calls, "the eager reference ran through attnkit"
        got = model(ids).logits
    assert len(seen.calls) == cfg.num_hidden_layers and all(c.sinks is not None for c in seen.calls)
    err = (got - want).abs().max().item()
    assert err <= TOL, f"gpt-oss with sinks: attnkit vs eager {err:.3g}"

def test_training_gradients_match_sdpa_with_a_window_and_dropout_off():
    ref = build("mistral", "sdpa").train()
    model = build("mistral", "attnkit").train()
    model.load_state_dict(ref.state_dict())
    ids = torch.randint(3, VOCAB, (2, 24))
    for m in (ref, model):
        m(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    for (name, a), (_, b) in zip(ref.named_parameters(), model.named_parameters()):
        err = (a.grad - b.grad).abs().max().item()
        assert err <= TOL, f"grad of {name}: attnkit vs sdpa {err:.3g}"


def test_two_sided_window_is_a_window_not_a_probed_mask():
    """transformers' bidirectional sliding window |q - kv| <= w is attnkit's sliding_window(w, w): a structured
    window (block skipping, no per-element probing), equal to transformers' own dense mask."""
    from transformers.masking_utils import sdpa_mask, sliding_window_bidirectional_mask_function

    from attnkit.integrations.hf.masks import mask_interface

    fn = sliding_window_bidirectional_mask_function(2)
    got = mask_interface(1, 9, 9, mask_function=fn)
    assert _kinds(got.spec) == {"TwoSidedWindow"}, got.spec
    want = sdpa_mask(batch_size=1, q_length=9, kv_length=9, mask_function=fn, allow_is_causal_skip=False)
    assert torch.equal(got.spec.to_dense(9)[0, 0], want[0, 0])


def test_config_output_attentions_returns_weights_after_switching():
    """A model whose config asks for attentions, switched to attnkit, returns attnkit's weights (it returned
    an empty tuple, silently)."""
    ref = build("llama", "eager")
    ref.config.output_attentions = True
    model = copy.deepcopy(ref)
    model.set_attn_implementation("attnkit")
    ids = torch.randint(3, VOCAB, (2, 6))
    with torch.no_grad():
        want, got = ref(input_ids=ids).attentions, model(input_ids=ids).attentions
    assert len(got) == len(want) == 2 and all(g is not None for g in got), got
    assert max((g - w).abs().max().item() for g, w in zip(got, want)) <= TOL


@pytest.mark.parametrize("q_offset", [torch.tensor(8), torch.tensor(10)])
def test_static_cache_decode_steps_keep_one_mask_structure(q_offset):
    """A static cache passes its offset as a 0-d tensor: every decode step gets explicit positions (the step
    where the cache fills got none, and a compiled forward compiled again there)."""
    from attnkit.integrations.hf.masks import mask_interface

    got = mask_interface(2, 1, 11, q_offset=q_offset)
    assert isinstance(got.spec, masks.Causal)
    assert got.q_positions.tolist() == [[int(q_offset)]] and got.kv_positions.tolist() == [list(range(11))]


def test_dynamic_cache_decode_step_needs_no_mask():
    from attnkit.integrations.hf.masks import mask_interface

    got = mask_interface(2, 1, 11, q_offset=10)
    assert got.spec is None and got.q_positions is None and got.kv_positions is None


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_layers_share_one_prepared_mask_per_forward(family):
    ids, am = _batch("left", batch=2)
    calls = _compare(family, ids, am)
    assert len(calls) == 2 and calls[0].prepared is calls[1].prepared, "each layer prepared the mask again"


def test_attention_forward_reads_backend_and_weights_flag_wherever_they_are_set():
    """The per-layer reads go through the instance dicts (cheap); a class attribute or a config without
    transformers' ``_output_attentions`` field is still honoured."""
    from types import SimpleNamespace

    from attnkit.integrations.hf.attention import _backend_of, _wants_weights

    class Layer(torch.nn.Module):
        attnkit_backend = "math"

    layer = Layer()
    assert _backend_of(layer) == "math" and _backend_of(torch.nn.Linear(2, 2)) == "auto"
    layer.attnkit_backend = "sdpa"
    assert _backend_of(layer) == "sdpa"
    layer.config = SimpleNamespace(output_attentions=True)  # no _output_attentions field
    assert _wants_weights(layer, {}) is True and _wants_weights(layer, {"output_attentions": False}) is False
    layer.config = SimpleNamespace(_output_attentions=False, output_attentions=True)
    assert _wants_weights(layer, {}) is False  # transformers' field is the flag its property returns
    layer.config._output_attentions = True  # the config's fields are read live, not a copy taken on the first call
    assert _wants_weights(layer, {}) is True


def _set_output_attentions(model, flag: bool) -> None:
    model.set_attn_implementation("eager")  # (transformers refuses the flag while another implementation is set)
    model.config.output_attentions = flag  # a property, stored as the config's _output_attentions
    model.set_attn_implementation("attnkit")


def test_the_weights_flag_follows_a_transformers_config_between_calls():
    """Each layer keeps its config's fields dict after the first call: later changes of the flag still count."""
    model = build("llama", "attnkit")
    ids = torch.randint(3, VOCAB, (1, 5))
    with torch.no_grad():
        assert not model(input_ids=ids).attentions
        _set_output_attentions(model, True)
        got = model(input_ids=ids).attentions
        assert len(got) == 2 and all(a is not None for a in got)
        _set_output_attentions(model, False)
        assert not model(input_ids=ids).attentions
