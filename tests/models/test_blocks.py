"""Blocks from injected parts: checkpoints written before the redesign still load and give the same logits,
the builder's parts are the ones asked for, per-layer mask kinds decode like the full forward, and the
typed errors of the new config fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, load_model
from torch import nn

import attnkit as ak
from attnkit.errors import AttnkitValueError
from attnkit.models.blocks import Block, block_from_config
from attnkit.models.builders import build_lm, lm_config
from attnkit.models.lm import LMConfig, TransformerLM

DATA = Path(__file__).parent / "data"
V = 257


@pytest.mark.parametrize("name", ["rope_gqa_window", "learned_bias_untied", "alibi_encoder"])
def test_checkpoints_written_before_the_redesign_load_and_match(name):
    """The three fixtures were written by main at 3493991 (config JSON + safetensors + logits of 2 x 9 tokens)."""
    config = LMConfig.from_dict(json.loads((DATA / f"{name}.json").read_text()))
    model = TransformerLM(config).eval()
    missing, unexpected = load_model(model, str(DATA / f"{name}.safetensors"), strict=True)
    assert not missing and not unexpected
    want = load_file(str(DATA / f"{name}.expected.safetensors"))
    with torch.no_grad():
        got = model(want["tokens"])
    torch.testing.assert_close(got, want["logits"], rtol=0, atol=1e-6)


def test_builder_injects_the_parts_the_config_names():
    model = build_lm("nano", embed_dim=32, norm="rmsnorm", mlp="swiglu", num_kv_heads=1, head_dim=24, qkv_bias=True,
                     rope_base=5e5, rope_scaling={"rope_type": "linear", "factor": 2.0}, qk_norm=True,
                     window=(None, 4), num_layers=2)
    a, b = model.blocks[0], model.blocks[1]
    assert isinstance(a.norm1, nn.RMSNorm) and isinstance(model.norm, nn.RMSNorm)
    assert isinstance(a.mlp, ak.nn.GatedMLP) and a.mlp.activation == "silu"
    assert a.attn.qkv_proj.weight.shape == ((2 + 2 * 1) * 24, 32) and a.attn.qkv_proj.bias is not None
    assert a.attn.out_proj.bias is None and a.attn.out_proj.in_features == 2 * 24
    assert a.attn.rotary.base == 5e5 and isinstance(a.attn.rotary.scaling, ak.positions.LinearScaling)
    assert isinstance(a.attn.q_norm, nn.RMSNorm) and a.attn.q_norm.normalized_shape == (24,)
    assert a.mask is None and repr(b.mask) == "sliding_window(4)"
    assert repr(model.mask(layer=0)) == "causal()" and repr(model.mask(layer=1)) == "sliding_window(4)"


def test_post_norm_block_and_bert_embeddings():
    model = build_lm("nano", embed_dim=32, causal=False, post_norm=True, bias=True, positions="learned",
                     type_vocab_size=2, embed_norm=True, mlp="gelu_exact").eval()
    assert isinstance(model.norm, nn.Identity) and model.blocks[0].post_norm
    tokens = torch.randint(0, V, (2, 7))
    types = torch.tensor([[0] * 4 + [1] * 3] * 2)
    assert not torch.allclose(model.encode(tokens, token_types=types), model.encode(tokens))
    torch.testing.assert_close(model.encode(tokens), model.encode(tokens, token_types=torch.zeros_like(tokens)))
    with pytest.raises(AttnkitValueError, match="token_types given but the model has no token-type embeddings"):
        build_lm("nano")(tokens, token_types=types)


def test_a_hand_assembled_block_equals_the_builders():
    """Block(attn, mlp, norm1, norm2, mask=...) by hand is the same module the builder makes from the config."""
    config = lm_config("nano", embed_dim=32, norm="rmsnorm", mlp="swiglu", num_kv_heads=1, window=5)
    torch.manual_seed(0)
    built = block_from_config(config, 0)
    attn = ak.nn.MultiHeadAttention(32, 2, num_kv_heads=1, bias=False, rotary=ak.positions.RoPE(16))
    hand = Block(attn, ak.nn.GatedMLP(32, 128), nn.RMSNorm(32, eps=1e-5), nn.RMSNorm(32, eps=1e-5),
                 mask=ak.masks.sliding_window(5))
    hand.load_state_dict(built.state_dict())
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(hand(x, hand.mask), built(x, built.mask))


@pytest.mark.parametrize("kind", ["dynamic", "static", "sliding"])
def test_mixed_window_layers_decode_like_the_full_forward(kind):
    """Gemma-2-style alternating layers: sliding-window caches on the window layers, full caches on the rest."""
    model = build_lm("nano", embed_dim=32, num_layers=3, window=(3, None, 3)).eval()
    caches = model.new_cache(2, kind=kind, max_length=10)
    if kind == "sliding":
        assert [type(c).__name__ for c in caches] == ["SlidingWindowCache", "StaticCache", "SlidingWindowCache"]
    tokens = torch.randint(0, V, (2, 10))
    with torch.no_grad():
        full = model(tokens)
        out = [model(tokens[:, :4], positions=torch.arange(4)[None], cache=caches)]
        for p in range(4, 10):
            out.append(model(tokens[:, p:p + 1], positions=torch.tensor([[p]]), cache=caches))
    torch.testing.assert_close(torch.cat(out, dim=1), full, rtol=1e-5, atol=1e-5)


def test_config_with_the_new_fields_round_trips_through_json():
    config = lm_config("tiny", norm="rmsnorm", mlp="swiglu", window=(None, 8, None, 8), head_dim=16,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64})
    assert LMConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"norm": "batchnorm"}, "norm must be one of"),
    ({"mlp": "moe"}, "mlp must be one of"),
    ({"rope_style": "spiral"}, "rope_style must be one of"),
    ({"type_vocab_size": -1}, "type_vocab_size must be >= 0"),
    ({"window": (3,)}, "window has 1 entries but num_layers=2"),
    ({"window": (3, None), "causal": False}, "window=3 needs causal=True"),
    ({"head_dim": 0}, "head_dim must be a positive int"),
])
def test_config_errors(kwargs, match):
    with pytest.raises(AttnkitValueError, match=match):
        LMConfig(num_layers=2, **kwargs)


def test_part_factories_name_their_registries():
    with pytest.raises(AttnkitValueError, match=r"mlp must be one of .*register a new kind in attnkit.nn.mlp.MLPS"):
        ak.nn.make_mlp("moe", 8, 16)
    with pytest.raises(AttnkitValueError, match=r"norm must be one of .*attnkit.nn.norms.NORMS"):
        ak.nn.make_norm("batchnorm", 8)
    with pytest.raises(AttnkitValueError, match="activation must be one of"):
        ak.nn.MLP(8, 16, activation="swish2")


def test_dropout_modules_run_only_when_training_with_p_above_zero():
    """At eval (or p == 0) the dropout modules are skipped, not called as identities (one module dispatch per
    layer per decode step); in training with p > 0 they still run and change the output."""
    torch.manual_seed(0)
    model = build_lm("nano", vocab_size=V, embed_dim=32, num_layers=2, num_heads=2, dropout=0.5)
    calls = []
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.register_forward_hook(lambda *_: calls.append(1))
    tokens = torch.randint(0, V, (2, 9))
    model.eval()
    evaluated = model(tokens)
    assert calls == []
    model.train()
    torch.manual_seed(1)
    trained = model(tokens)
    assert len(calls) == 1 + 2 * 2  # embeddings, and per layer the residual and the MLP dropout
    assert not torch.allclose(trained, evaluated)
    model.eval()
    assert torch.equal(model(tokens), evaluated)
