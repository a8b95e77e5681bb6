"""TransformerLM: the float64 reference assembly, the invariants (no causal/packing/padding leak, cached ==
full), init, tying, presets, per-layer attention kinds, gradient checkpointing and the typed errors."""

import copy
import math
import sys

import pytest
import torch
import torch.nn.functional as F

from attnkit import masks
from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.functional.reference import reference_attention
from attnkit.models.blocks import ATTENTION_LAYERS, register_attention_layer, softmax_attention
from attnkit.models.builders import PRESETS, build_encoder, build_lm, embed_sequences, lm_config
from attnkit.models.config import LMConfig
from attnkit.models.lm import TransformerLM
from attnkit.training.data import restart_positions
from oracle import assert_within_rule

V = 257


def _norm(module, x):
    """A norm module written out plainly (LayerNorm or RMSNorm) in x's dtype."""
    if isinstance(module, torch.nn.LayerNorm):
        return F.layer_norm(x, module.normalized_shape, module.weight, module.bias, module.eps)
    assert isinstance(module, torch.nn.RMSNorm), module
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + module.eps) * module.weight


def _mlp(mlp, h):
    if hasattr(mlp, "gate"):  # SwiGLU / GeGLU
        return mlp.down(mlp.act(mlp.gate(h)) * mlp.up(h))
    return mlp.down(mlp.act(mlp.up(h)))


def reference_forward(model: TransformerLM, tokens, positions=None, doc_ids=None, key_is_real=None, dtype=None,
                      token_types=None):
    """The LM written out plainly around reference_attention, in ``dtype`` (float64 = golden)."""
    m = copy.deepcopy(model).to(dtype or torch.float64)
    c = m.config
    B, L = tokens.shape
    pos = torch.arange(L)[None] if positions is None else positions.reshape(-1, L)  # (B|1, L)
    x = m.embed.weight[tokens]  # (B, L, E)
    if m.pos_embed is not None:
        x = x + m.pos_embed(pos).to(x.dtype)
    if c.type_vocab_size:
        x = x + m.type_embed.weight[torch.zeros_like(tokens) if token_types is None else token_types]
    if c.embed_norm:
        x = _norm(m.embed_norm, x)
    for i, block in enumerate(m.blocks):
        a = block.attn
        h = x if c.post_norm else _norm(block.norm1, x)
        H, Hkv, D = a.num_heads, a.num_kv_heads, a.head_dim
        q, k, v = F.linear(h, a.qkv_proj.weight, a.qkv_proj.bias).split([H * D, Hkv * D, Hkv * D], dim=-1)
        q = q.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k = k.view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        v = v.view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
        if a.q_norm is not None:
            q, k = _norm(a.q_norm, q), _norm(a.k_norm, k)
        if a.rotary is not None:
            q, k = a.rotary(q, pos), a.rotary(k, pos)
        mask = m.mask(doc_ids=doc_ids, key_is_real=key_is_real, layer=i)
        o = reference_attention(q, k, v, mask, bias=a.score_bias, q_positions=pos, kv_positions=pos)  # (B, H, L, D)
        o = F.linear(o.transpose(1, 2).reshape(B, L, H * D), a.out_proj.weight, a.out_proj.bias)  # (B, L, E)
        x = _norm(block.norm1, x + o) if c.post_norm else x + o
        h = x if c.post_norm else _norm(block.norm2, x)
        x = _norm(block.norm2, x + _mlp(block.mlp, h)) if c.post_norm else x + _mlp(block.mlp, h)
    if not c.post_norm:
        x = _norm(m.norm, x)
    return (x @ m.head.weight.T).detach()  # (B, L, V)


CONFIGS = [
    {"positions": "rope"},
    {"positions": "alibi", "num_heads": 4, "num_kv_heads": 2},
    {"positions": "sinusoidal", "num_kv_heads": 1},
    {"positions": "learned", "tie_embeddings": False},
    {"positions": "rope", "window": 3},
    {"positions": "none", "bias": True},
    # the parts real families need (LLaMA / Mistral / Qwen2 / Gemma-2 / BERT / Qwen3-like)
    {"norm": "rmsnorm", "mlp": "swiglu", "num_kv_heads": 1, "head_dim": 24, "rope_base": 5e5, "tie_embeddings": False},
    {"norm": "rmsnorm", "mlp": "swiglu", "qkv_bias": True, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    {"window": (3, None), "mlp": "geglu", "norm_eps": 1e-6},
    {"positions": "learned", "bias": True, "post_norm": True, "mlp": "gelu_exact", "type_vocab_size": 2,
     "embed_norm": True},
    {"norm": "rmsnorm", "qk_norm": True, "rope_style": "interleaved", "mlp_hidden": 40},
]


def _model(**kw):
    return build_lm("nano", embed_dim=32, **kw).eval()


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_forward_matches_float64_reference(kw):
    model = _model(**kw)
    tokens = torch.randint(0, V, (2, 13))
    golden = reference_forward(model, tokens)
    assert_within_rule(model(tokens).detach(), reference_forward(model, tokens, dtype=torch.float32), golden)


@pytest.mark.parametrize("kw", CONFIGS[:4], ids=lambda kw: kw["positions"])
def test_packed_rows_match_float64_reference_and_separate_documents(kw):
    model = _model(**kw)
    tokens = torch.randint(0, V, (1, 12))
    doc_ids = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3])
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]])
    packed = model(tokens, positions=positions, doc_ids=doc_ids).detach()
    golden = reference_forward(model, tokens, positions, doc_ids)
    assert_within_rule(packed, reference_forward(model, tokens, positions, doc_ids, dtype=torch.float32), golden)
    separate = torch.cat([model(tokens[:, s:e]) for s, e in ((0, 5), (5, 9), (9, 12))], dim=1).detach()
    torch.testing.assert_close(packed, separate, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 3])
def test_packed_rows_reach_attention_as_one_structured_mask(window):
    """Defect 5: packed rows used to reach attention as a dense (B, 1, L, L) tensor, which no backend can skip
    blocks of; now every layer gets the same structured ``pattern & document`` mask."""
    model = _model(window=window)
    seen = []
    for block in model.blocks:
        block.attn.register_forward_pre_hook(lambda mod, args: seen.append(args[1]))
    doc = torch.tensor([[0] * 5 + [1] * 4 + [2] * 3])
    model(torch.randint(0, V, (1, 12)), positions=restart_positions(doc), doc_ids=doc)
    assert len(seen) == len(model.blocks) and all(m is seen[0] for m in seen)  # prepared once, shared
    assert isinstance(seen[0], masks.PreparedMask) and isinstance(seen[0].spec, masks.MaskSpec), \
        f"not a structured mask prepared once: {type(seen[0])}"
    assert seen[0].structure.doc_ids is not None  # the backends can see the documents
    assert "document" in repr(seen[0].spec) and ("sliding_window(3)" if window else "causal") in repr(seen[0].spec)


def test_packed_rows_with_irregular_positions_match_the_reference():
    model = _model(positions="alibi", num_heads=4)
    tokens = torch.randint(0, V, (1, 9))
    doc_ids = torch.tensor([[0] * 5 + [1] * 4])
    positions = torch.tensor([[0, 2, 4, 6, 8, 0, 3, 6, 9]])
    golden = reference_forward(model, tokens, positions, doc_ids)
    assert_within_rule(model(tokens, positions=positions, doc_ids=doc_ids).detach(),
                       reference_forward(model, tokens, positions, doc_ids, dtype=torch.float32), golden)


@pytest.mark.parametrize("kw", CONFIGS, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_no_causal_leak(kw):
    model = _model(**kw)
    a = torch.randint(0, V, (1, 10))
    b = a.clone()
    b[:, 6:] = torch.randint(0, V, (1, 4))
    torch.testing.assert_close(model(a)[:, :6], model(b)[:, :6], rtol=0, atol=0)
    assert not torch.allclose(model(a)[:, 6:], model(b)[:, 6:])


def test_window_at_least_length_equals_causal():
    torch.manual_seed(1)
    full = _model()
    windowed = TransformerLM(full.config.replace(window=16)).eval()
    windowed.load_state_dict(full.state_dict())
    tokens = torch.randint(0, V, (2, 16))
    torch.testing.assert_close(windowed(tokens), full(tokens), rtol=1e-6, atol=1e-6)
    narrow = TransformerLM(full.config.replace(window=4)).eval()
    narrow.load_state_dict(full.state_dict())
    assert not torch.allclose(narrow(tokens)[:, 8:], full(tokens)[:, 8:])


@pytest.mark.parametrize("kind", ["dynamic", "static", "sliding"])
def test_cached_decoding_equals_full_forward(kind):
    model = _model(window=5 if kind == "sliding" else None, positions="rope", num_kv_heads=1)
    tokens = torch.randint(0, V, (2, 11))
    full = model(tokens)
    cache = model.new_cache(2, kind=kind, max_length=11)
    out = [model(tokens[:, :4], positions=torch.arange(4)[None], cache=cache)]  # prefill
    for p in range(4, 11):
        out.append(model(tokens[:, p:p + 1], positions=torch.tensor([[p]]), cache=cache))
    torch.testing.assert_close(torch.cat(out, dim=1), full, rtol=1e-5, atol=1e-5)


def test_padding_does_not_change_real_outputs_encoder_and_decoder():
    for model in (build_encoder("nano", embed_dim=32).eval(), _model()):
        tokens = torch.randint(0, V, (2, 9))
        key_is_real = torch.ones(2, 9, dtype=torch.bool)
        key_is_real[1, 6:] = False
        other = tokens.clone()
        other[1, 6:] = torch.randint(0, V, (3,))
        a = model(tokens, key_is_real=key_is_real)
        b = model(other, key_is_real=key_is_real)
        torch.testing.assert_close(a[1, :6], b[1, :6], rtol=0, atol=0)
        golden = reference_forward(model, tokens, key_is_real=key_is_real)
        assert_within_rule(a.detach(), reference_forward(model, tokens, key_is_real=key_is_real, dtype=torch.float32),
                           golden)


def test_encoder_is_bidirectional_and_embeds():
    enc = build_encoder("nano", embed_dim=32).eval()
    assert not enc.config.causal
    a = torch.randint(0, V, (2, 8))
    b = a.clone()
    b[:, -1] = (b[:, -1] + 1) % V
    assert not torch.allclose(enc.encode(a)[:, 0], enc.encode(b)[:, 0])  # the first token sees the last
    real = torch.tensor([[True] * 8, [True] * 5 + [False] * 3])
    emb = embed_sequences(enc, a, real)
    assert emb.shape == (2, 32)
    torch.testing.assert_close(emb[1], enc.encode(a, key_is_real=real)[1, :5].mean(0))
    torch.testing.assert_close(embed_sequences(enc, a), enc.encode(a).mean(1))


def test_init_statistics_and_tying():
    model = build_lm("small", num_layers=8).requires_grad_(False)
    std, resid = 0.02, 0.02 / math.sqrt(2 * 8)
    assert model.head.weight is model.embed.weight
    assert abs(float(model.embed.weight.std()) - std) < 0.1 * std
    assert abs(float(model.blocks[0].attn.qkv_proj.weight.std()) - std) < 0.1 * std
    for block in model.blocks:
        assert abs(float(block.attn.out_proj.weight.std()) - resid) < 0.1 * resid
        assert abs(float(block.mlp.down.weight.std()) - resid) < 0.1 * resid
    untied = build_lm("nano", tie_embeddings=False)
    assert untied.head.weight is not untied.embed.weight
    assert untied.num_parameters() == build_lm("nano").num_parameters() + V * 64


def test_presets_grow():
    sizes = [build_lm(p).num_parameters() for p in ("nano", "tiny")]
    assert sizes[0] < sizes[1]
    assert lm_config("small").embed_dim == PRESETS["small"]["embed_dim"] and lm_config("tiny", embed_dim=96).embed_dim == 96


def test_per_layer_attention_kind_is_pluggable():
    built = []

    def recording(config, index):
        built.append(index)
        return softmax_attention(config, index)

    register_attention_layer("recording", recording)
    try:
        model = build_lm("nano", attention=["softmax", "recording"])  # a JSON list works too
        assert built == [1] and model.config.attention == ("softmax", "recording")
        model(torch.randint(0, V, (1, 5)))
    finally:
        ATTENTION_LAYERS.pop("recording")


def test_a_layer_kind_says_how_it_reads_the_mask():
    """issue 20 item 5: the model tested isinstance(block.attn, LinearAttention), so a plugged-in layer kind that
    reads padding by key index (as linear attention does) still got the position-bound, prepared mask."""
    from attnkit.models.blocks import linear_attention

    seen = []

    class ByIndex(torch.nn.Module):
        mask_by_key_index = True

        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, mask, **kwargs):
            seen.append(type(mask).__name__)
            return self.inner(x, mask, **kwargs)

    register_attention_layer("by-index", lambda config, index: ByIndex(linear_attention(config, index)))
    try:
        model = build_lm("nano", attention=["softmax", "by-index"], positions="sinusoidal").eval()
        tokens = torch.randint(0, V, (2, 6))
        real = torch.tensor([[False, True, True, True, True, True], [True] * 6])
        model(tokens, key_is_real=real)
        assert seen and "PreparedMask" not in seen, seen  # the softmax layer's mask is prepared, this one's is not
        plain = build_lm("nano", attention=["softmax", "linear"], positions="sinusoidal").eval()
        plain.load_state_dict({k.replace("inner.", ""): v for k, v in model.state_dict().items()})
        torch.testing.assert_close(model(tokens, key_is_real=real), plain(tokens, key_is_real=real))
    finally:
        ATTENTION_LAYERS.pop("by-index")


def test_gradient_checkpointing_gives_the_same_gradients():
    model = build_lm("nano", dropout=0.0)
    tokens = torch.randint(0, V, (2, 12))
    grads = []
    for flag in (False, True):
        model.zero_grad()
        model.gradient_checkpointing = flag
        F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten()).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_config_round_trips_through_json_dict():
    config = lm_config("tiny", num_kv_heads=2, window=32, attention=("softmax",) * 4)
    assert LMConfig.from_dict(config.to_dict()) == config


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_learned_positions_past_the_table_still_raise_when_the_caches_supply_them(kind):
    """The learned table's range check, moved to the cache's host-side bound, still fires: offset prompts too."""
    model = _model(positions="learned", max_seq_len=8)
    cache = model.new_cache(1, kind=kind, max_length=12)
    with torch.inference_mode():
        model(torch.zeros(1, 3, dtype=torch.long), positions=torch.arange(4, 7)[None], cache=cache)
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)  # position 7: the table's last
        with pytest.raises(AttnkitValueError, match=r"positions must be < max_positions=8, got value 8"):
            model(torch.zeros(1, 1, dtype=torch.long), cache=cache)


def test_logits_to_keep_gives_the_last_positions_logits():
    torch.manual_seed(0)
    model = _model()
    tokens = torch.randint(0, V, (2, 7))
    with torch.no_grad():
        full = model(tokens)
        for n in (1, 3, 7):
            assert (model(tokens, logits_to_keep=n) - full[:, -n:]).abs().max().item() <= 1e-6


def _one_layer_ahead() -> list:
    """A 2-layer model's caches where only the first layer saw a prompt (the user fed the layers separately)."""
    caches = _model().new_cache(1)
    c = caches[0]
    c.update(*(torch.zeros(1, c.num_kv_heads, 3, c.head_dim) for _ in range(2)), torch.arange(3)[None])
    return caches


@pytest.mark.parametrize("kind", ["dynamic", "static"])
@pytest.mark.parametrize("positions", ["learned", "rope"])
def test_cached_forward_without_positions_continues_the_caches(kind, positions, monkeypatch):
    """model(tokens, cache=c) without positions: every layer continues its own cache (offset prompts too), logits
    bitwise equal to passing the positions, and nothing read back from the device per step by the model, its
    layers, caches or learned table after one read per sequence (the old code raised; given positions cost a
    check per layer, and a learned table read its min and max; ak.attention's own checks are its business)."""
    from attnkit.cache import base

    torch.manual_seed(0)
    model = _model(positions=positions)
    tokens = torch.randint(0, V, (2, 9))
    start = torch.tensor([[0], [4]])  # row 1 starts at position 4
    given, free = (model.new_cache(2, kind=kind, max_length=12) for _ in range(2))
    with torch.inference_mode():
        for cache in (given, free):
            model(tokens[:, :5], positions=start + torch.arange(5), cache=cache)
        reads = []

        def spy(name, real):
            def read(*args):
                caller = sys._getframe(1).f_code.co_filename  # the model, its layers, caches and learned table
                if any(part in caller for part in ("attnkit/models/", "attnkit/nn/", "attnkit/cache/", "learned.py")):
                    reads.append(f"{name} in {caller}")
                return real(*args)
            return read

        for owner, name in ((torch, "equal"), (torch.Tensor, "__int__"), (torch.Tensor, "item"),
                            (torch.Tensor, "tolist")):
            monkeypatch.setattr(owner, name, spy(name, getattr(owner, name)))
        for t in range(5, 9):
            reads.clear()
            got = model(tokens[:, t:t + 1], cache=free)
            # once per sequence, the first cache's largest position comes back to the host (the learned table's bound)
            assert reads == ([f"__int__ in {base.__file__}"] if t == 5 else []), reads
            assert torch.equal(got, model(tokens[:, t:t + 1], positions=start + t, cache=given))


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: lm_config("huge"), AttnkitValueError, "unknown preset 'huge'"),
    (lambda: LMConfig(positions="xpos"), AttnkitValueError, "positions must be one of"),
    (lambda: LMConfig(window=4, causal=False), AttnkitValueError, "window=4 needs causal=True"),
    (lambda: LMConfig(embed_dim=0), AttnkitValueError, "dim must be a positive int"),
    (lambda: LMConfig(dropout=1.5), AttnkitValueError, "dropout must be in"),
    (lambda: LMConfig(num_layers=2, attention=("softmax",)), AttnkitValueError, "attention has 1 entries but num_layers=2"),
    (lambda: TransformerLM(LMConfig(attention="nope")), AttnkitValueError,
     "kind 'nope' .* is not registered.*register_attention_layer"),
    (lambda: LMConfig.from_dict({"dims": 3}), AttnkitValueError, r"unknown LMConfig fields \['dims'\]"),
    (lambda: TransformerLM({"dim": 8}), AttnkitTypeError, "config must be an LMConfig"),
    (lambda: _model()(torch.rand(1, 4)), AttnkitTypeError, "tokens must be an int64 tensor"),
    (lambda: _model(attention="linear")(torch.zeros(1, 4, dtype=torch.long), cache=_model(attention="linear").new_cache(1)),
     AttnkitValueError, r"positions must be given with cache= when no layer's cache keeps positions"),
    (lambda: _model()(torch.zeros(1, 1, dtype=torch.long), cache=_one_layer_ahead()), AttnkitValueError,
     r"positions=None continues the caches, but their layers hold different numbers of tokens \[3, 0\]"),
    (lambda: _model()(torch.zeros(1, 4, dtype=torch.long), positions=torch.arange(4)[None], cache=[]),
     AttnkitValueError, "cache has 0 entries but the model has 2 layers"),
    (lambda: build_encoder("nano").new_cache(1), AttnkitValueError, "new_cache needs a causal decoder"),
    (lambda: _model()(torch.zeros(1, 4, dtype=torch.long), logits_to_keep=-1), AttnkitValueError,
     r"logits_to_keep must be >= 0, got -1; pass 0 \(every position\) or n > 0 \(the last n\)"),
    (lambda: _model()(torch.zeros(1, 4, dtype=torch.long), logits_to_keep=True), AttnkitTypeError,
     "logits_to_keep must be an int, got True"),
])
def test_errors(make, error, match):
    with pytest.raises(error, match=match):
        make()


@pytest.mark.parametrize("positions", ["row", "batch"])
def test_positions_equal_to_the_default_take_the_default_path(positions):
    """Packed rows that each hold one document have positions arange(L): the layers then see no positions (the
    default path: rotary table, one mask on default positions) and the logits are those of positions=None."""
    model = _model()
    tokens = torch.randint(0, V, (2, 12))
    pos = torch.arange(12) if positions == "row" else torch.arange(12).expand(2, -1)
    seen = []
    model.blocks[0].attn.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(kwargs["positions"]),
                                                   with_kwargs=True)
    doc = torch.zeros(2, 12, dtype=torch.long)
    with torch.no_grad():
        got = model(tokens, positions=pos, doc_ids=doc)
        want = model(tokens, doc_ids=doc)
        shifted = model(tokens, positions=pos + 1, doc_ids=doc)
    assert seen[0] is None and seen[2] is not None, "arange positions should reach the layers as the default"
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(AttnkitValueError, match="positions 3"):
        model(tokens, positions=torch.arange(12).expand(3, -1))  # a batch that doesn't fit is still refused
    assert shifted.shape == got.shape
