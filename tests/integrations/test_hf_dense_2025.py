"""Converters for the dense 2025-26 families (issue 29 item 5): Qwen3 (QK-norm), SmolLM3 (NoPE layers) and Gemma-3
(sandwich norms, two RoPE bases, query_pre_attn_scalar, scaled embeddings, Gemma's RMSNorm) into
attnkit's TransformerLM and back. convert -> TransformerLM -> export: logits within 1e-5 of the source's and the
same greedy tokens, on tiny random configs built from transformers' own config classes (norm weights perturbed,
so QK-norm is not the identity)."""

from __future__ import annotations

import pytest
import torch
from hf_tiny import VOCAB, WINDOW, tf

from attnkit.cli.main import main
from attnkit.integrations.hf.convert import from_hf
from attnkit.runs import load_model

_COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "rms_norm_eps": 1e-6,
           "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
CASES = {
    "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**_COMMON, head_dim=16, tie_word_embeddings=False)),
    "qwen3-sliding": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(
        **_COMMON, head_dim=8, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    "smollm3": lambda: tf.SmolLM3ForCausalLM(tf.SmolLM3Config(**_COMMON, no_rope_layers=[1, 0, 1])),
    "smollm3-interval": lambda: tf.SmolLM3ForCausalLM(tf.SmolLM3Config(
        **{**_COMMON, "num_hidden_layers": 4}, no_rope_layer_interval=2, tie_word_embeddings=False)),
}


def _gemma3(**kw):
    config = tf.Gemma3TextConfig(**{**_COMMON, "num_hidden_layers": 4, "head_dim": 8, "sliding_window": WINDOW,
                                    "query_pre_attn_scalar": 12, "layer_types": ["sliding_attention",
                                    "full_attention", "sliding_attention", "full_attention"], **kw})
    return tf.Gemma3ForCausalLM(config)


CASES["gemma3"] = _gemma3
CASES["gemma3-linear-global"] = lambda: _gemma3(rope_parameters={
    "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}, tie_word_embeddings=False)


def _source(case: str):
    torch.manual_seed(0)
    hf = CASES[case]().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))  # QK-norm and the block norms: not the identity
    hf.set_attn_implementation("sdpa")
    return hf


def _greedy(model, prompt, n: int = 8):
    return model.generate(prompt, max_new_tokens=n, do_sample=False, attention_mask=torch.ones_like(prompt))[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_convert_then_export_round_trips_logits_and_greedy_tokens(case, tmp_path, capsys):
    source = _source(case)
    family = {"gemma3": "gemma3_text"}.get(case.split("-")[0], case.split("-")[0])
    source.save_pretrained(tmp_path / "hf")
    assert main(["convert", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "run")]) == 0
    assert main(["export", str(tmp_path / "run"), "--hf", str(tmp_path / "out")]) == 0
    assert f"({family})" in capsys.readouterr().out
    ours = load_model(tmp_path / "run")
    exported = tf.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(exported) is type(source)
    assert set(exported.state_dict()) == set(source.state_dict())
    tokens = torch.randint(3, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))  # (B, L): past the window
    with torch.no_grad():
        want = source(input_ids=tokens).logits
        for what, got in (("attnkit", ours(tokens)), ("exported", exported(input_ids=tokens).logits)):
            diff = (got - want).abs().max().item()
            assert diff <= 1e-5, f"{case}: {what} logits off by {diff:.3g}"
        prompt = tokens[:1, :6]
        want_tokens = _greedy(source, prompt)
        assert torch.equal(_greedy(exported, prompt), want_tokens)
        mine = prompt
        for _ in range(want_tokens.shape[0] - prompt.shape[1]):
            mine = torch.cat([mine, ours(mine)[:, -1:].argmax(-1)], dim=1)  # (1, L + 1)
        assert torch.equal(mine[0], want_tokens)


def test_the_parts_are_lmconfig_fields():
    qwen3, smol = from_hf(_source("qwen3")).config, from_hf(_source("smollm3")).config
    assert (qwen3.qk_norm, qwen3.head_dim, qwen3.tie_embeddings) == (True, 16, False)
    assert smol.positions == ("rope", "none", "rope")
    assert [type(b.attn.rotary).__name__ if b.attn.rotary is not None else None
            for b in from_hf(_source("smollm3")).blocks] == ["RoPE", None, "RoPE"]


def test_a_per_layer_positions_tuple_is_checked():
    from attnkit.errors import AttnkitValueError
    from attnkit.models.config import LMConfig

    with pytest.raises(AttnkitValueError, match=r"a per-layer tuple needs one of \('rope', 'alibi', 'none'\) for "
                                                r"each of the num_layers=2 layers"):
        LMConfig(num_layers=2, positions=("rope", "learned"))
    with pytest.raises(AttnkitValueError, match="for each of the num_layers=2 layers"):
        LMConfig(num_layers=2, positions=("rope",))


def test_gemma3_s_parts():
    cfg = from_hf(_source("gemma3")).config
    assert (cfg.norm, cfg.mlp, cfg.sandwich_norm, cfg.qk_norm) == ("offset_rmsnorm", "geglu", True, True)
    assert (cfg.embed_scale, cfg.attn_scale, cfg.rope_base, cfg.local_rope_base) == (32 ** 0.5, 12 ** -0.5, 1e6, 1e4)
    assert cfg.window == (WINDOW, None, WINDOW, None)
