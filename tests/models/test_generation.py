"""Generation: sampling rules, seeds, stop tokens, budgets, streaming, errors; the protocol on TransformerLM."""

from __future__ import annotations

import pytest
import torch

from attnkit.errors import AttnkitTypeError, AttnkitValueError
from attnkit.models.generation import DecoderModel, generate, padding_by_position, sample, stream_generate
from cache.tiny_decoder import TinyDecoder

PROMPTS = [[1, 2, 3, 4], [7, 8]]


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return TinyDecoder(positions="rope", heads=4, kv_heads=2).eval()


def test_tiny_decoder_implements_the_protocol(model):
    assert isinstance(model, DecoderModel)


def test_seed_makes_sampling_reproducible(model):
    a = generate(model, PROMPTS, max_new_tokens=10, temperature=1.5, seed=3)
    assert generate(model, PROMPTS, max_new_tokens=10, temperature=1.5, seed=3) == a
    assert generate(model, PROMPTS, max_new_tokens=10, temperature=1.5, seed=4) != a
    state = torch.get_rng_state()
    generate(model, PROMPTS, max_new_tokens=3, temperature=1.0, seed=0)
    assert torch.equal(state, torch.get_rng_state())  # a seed uses a private generator


def test_top_k_1_and_tiny_top_p_are_greedy(model):
    greedy = generate(model, PROMPTS, max_new_tokens=8)
    assert generate(model, PROMPTS, max_new_tokens=8, temperature=2.0, top_k=1, seed=0) == greedy
    assert generate(model, PROMPTS, max_new_tokens=8, temperature=2.0, top_p=1e-6, seed=0) == greedy


def test_top_k_and_top_p_keep_only_their_sets():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.1]])).expand(2000, 4)
    g = torch.Generator().manual_seed(0)
    assert set(sample(logits, temperature=1.0, top_k=2, generator=g).tolist()) == {0, 1}
    assert set(sample(logits, temperature=1.0, top_p=0.7, generator=g).tolist()) == {0, 1}  # 0.5 + 0.25 >= 0.7
    assert set(sample(logits, temperature=1.0, top_p=0.76, generator=g).tolist()) == {0, 1, 2}
    drawn = sample(logits, temperature=1.0, generator=g)
    assert set(drawn.tolist()) == {0, 1, 2, 3} and abs(float((drawn == 0).float().mean()) - 0.5) < 0.05


def test_stop_tokens_end_a_row_and_are_returned(model):
    greedy = generate(model, PROMPTS, max_new_tokens=10)
    stop = greedy[0][3]
    out = generate(model, PROMPTS, max_new_tokens=10, stop_tokens=[stop])
    first = greedy[0].index(stop)
    assert out[0] == greedy[0][: first + 1]
    other = greedy[1].index(stop) + 1 if stop in greedy[1] else 10
    assert out[1] == greedy[1][:other]


def test_max_new_tokens_and_streaming_order(model):
    assert generate(model, PROMPTS, max_new_tokens=0) == [[], []]
    seen = []
    out = generate(model, PROMPTS, max_new_tokens=5, on_token=lambda row, tok: seen.append((row, tok)))
    assert [len(o) for o in out] == [5, 5]
    assert seen == [(row, out[row][step]) for step in range(5) for row in range(2)]  # one token per row per step
    assert list(stream_generate(model, PROMPTS, max_new_tokens=5)) == seen


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_cache_kinds_give_the_same_tokens(model, kind):
    assert generate(model, PROMPTS, max_new_tokens=6, cache=kind) == generate(model, PROMPTS, max_new_tokens=6)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"prompts": []}, AttnkitValueError, "prompts must be a non-empty list"),
        ({"prompts": [[1], []]}, AttnkitValueError, "prompts must be a non-empty list"),
        ({"prompts": [[1, -2]]}, AttnkitValueError, "non-negative int token ids"),
        ({"max_new_tokens": -1}, AttnkitValueError, r"max_new_tokens must be >= 0, got -1; e.g. max_new_tokens=200"),
        ({"max_new_tokens": 2.5}, AttnkitTypeError, "max_new_tokens must be an int, got"),
        ({"temperature": -0.5}, AttnkitValueError, r"temperature must be >= 0, got -0.5; 0 = greedy"),
        ({"temperature": float("nan")}, AttnkitTypeError, "temperature must be a finite number"),
        ({"top_k": 5}, AttnkitValueError, "top_k / top_p only apply when sampling, but temperature 0 is greedy"),
        ({"temperature": 1.0, "top_k": 0}, AttnkitValueError, r"top_k must be >= 1, got 0; leave top_k out"),
        ({"temperature": 1.0, "top_p": 1.5}, AttnkitValueError, r"top_p must be in \(0, 1\], got 1.5"),
        ({"stop_tokens": ["eos"]}, AttnkitTypeError, "stop_tokens must be a collection of int"),
        ({"model": torch.nn.Linear(2, 2)}, AttnkitTypeError, "model must be a decoder model"),
        ({"cache": "sliding"}, AttnkitValueError, "kind='sliding' needs window"),
    ],
)
def test_generate_errors(model, kwargs, error, match):
    args = {"model": model, "prompts": PROMPTS}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        generate(args.pop("model"), args.pop("prompts"), max_new_tokens=args.pop("max_new_tokens", 2), **args)


def test_static_cache_too_small_is_an_error_not_a_truncation(model):
    from attnkit.cache import CacheFullError

    caches = model.new_cache(1, kind="static", max_length=4)
    with pytest.raises(CacheFullError, match="static cache is full"):
        model(torch.tensor([[1, 2, 3, 4, 5]]), positions=torch.arange(5)[None], cache=caches)


def test_padding_by_position_errors():
    with pytest.raises(AttnkitValueError, match="supports left padding only"):
        padding_by_position(torch.tensor([[True, False, True]]), torch.arange(3)[None])
    with pytest.raises(AttnkitTypeError, match="key_is_real must be a bool tensor"):
        padding_by_position(torch.ones(1, 3), torch.arange(3)[None])


@pytest.mark.parametrize(("kind", "window", "positions"), [("dynamic", None, "rope"), ("static", None, "alibi"),
                                                            ("sliding", 4, "rope"), ("dynamic", None, "learned")])
def test_transformer_lm_cached_equals_full(kind, window, positions):
    from attnkit.models.lm import LMConfig, TransformerLM

    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=41, embed_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, window=window,
                                positions=positions)).eval()
    assert isinstance(lm, DecoderModel)
    tokens = torch.randint(0, 41, (2, 13))
    with torch.no_grad():
        full = lm(tokens, positions=torch.arange(13)[None])
        cache = lm.new_cache(2, kind=kind, max_length=13)
        parts, i = [], 0
        for n in (5, 1, 3, 1, 1, 2):
            parts.append(lm(tokens[:, i:i + n], positions=torch.arange(i, i + n)[None], cache=cache))
            i += n
        assert float((torch.cat(parts, 1) - full).abs().max()) <= 1e-5
        prompt, want = tokens[0, :4], tokens[0, :4]
        for _ in range(6):
            want = torch.cat([want, lm(want[None])[0, -1].argmax()[None]])
    assert generate(lm, [prompt.tolist()], max_new_tokens=6, cache=kind) == [want[4:].tolist()]


@pytest.mark.parametrize(("kind", "window", "positions"), [("dynamic", None, "rope"), ("static", None, "learned"),
                                                            ("sliding", 3, "alibi")])
def test_transformer_lm_left_padded_batch_generates_each_row_alone(kind, window, positions):
    from attnkit.models.lm import LMConfig, TransformerLM

    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=41, embed_dim=32, num_layers=2, num_heads=4, positions=positions,
                                window=window)).eval()
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10]]
    with torch.no_grad():
        wants = []
        for p in prompts:  # greedy by recomputing the full forward, one prompt at a time
            t = torch.tensor([p])
            for _ in range(5):
                t = torch.cat([t, lm(t)[:, -1].argmax(-1, keepdim=True)], dim=1)
            wants.append(t[0, len(p):].tolist())
    assert generate(lm, prompts, max_new_tokens=5, cache=kind) == wants


class _GivenPositions:
    """A TransformerLM seen through the bare protocol (no ``positions_from_cache``): generate gives every step's
    positions, as it did for every model before."""

    def __init__(self, lm):
        self.lm = lm

    def __call__(self, tokens, **kwargs):
        return self.lm(tokens, **kwargs)

    def new_cache(self, *args, **kwargs):
        return self.lm.new_cache(*args, **kwargs)

    def parameters(self):
        return self.lm.parameters()


@pytest.mark.parametrize(("kind", "window", "positions"), [("dynamic", None, "rope"), ("static", None, "learned"),
                                                            ("sliding", 3, "alibi")])
def test_transformer_lm_decode_steps_continue_the_caches_with_the_same_tokens(kind, window, positions, monkeypatch):
    """generate passes positions=None after the prefill to a model whose caches continue themselves (no position
    tensor per step, nothing to check or read back); left-padded rows included, the tokens are those of every
    step's positions given."""
    from attnkit.models.lm import LMConfig, TransformerLM

    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=41, embed_dim=32, num_layers=2, num_heads=4, positions=positions,
                                window=window)).eval()
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10]]
    want = generate(_GivenPositions(lm), prompts, max_new_tokens=6, cache=kind)
    given = []
    forward = TransformerLM.forward
    monkeypatch.setattr(TransformerLM, "forward", lambda self, tokens, **kw: given.append(kw["positions"]) or
                        forward(self, tokens, **kw))
    assert generate(lm, prompts, max_new_tokens=6, cache=kind) == want
    assert given[0] is not None and given[1:] == [None] * 5


def test_generate_asks_a_model_that_takes_it_for_the_last_positions_logits_only(monkeypatch):
    """The prefill's head runs on the last prompt token only (logits_to_keep=1) when the model's forward takes it
    (a P x V matmul saved per call); a model without it is called as before; the tokens are the same."""
    from attnkit.models.lm import LMConfig, TransformerLM

    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=41, embed_dim=32, num_layers=2, num_heads=4)).eval()
    prompts = [[3, 4, 5, 6, 7, 8], [9, 10]]
    want = generate(_GivenPositions(lm), prompts, max_new_tokens=4)  # its __call__ takes no logits_to_keep
    widths = []
    forward = TransformerLM.forward


    def spy(self, tokens, *, logits_to_keep=0, **kw):  # the signature generate reads
        widths.append((logits_to_keep, tokens.shape[1]))
        return forward(self, tokens, logits_to_keep=logits_to_keep, **kw)

    monkeypatch.setattr(TransformerLM, "forward", spy)
    assert generate(lm, prompts, max_new_tokens=4) == want
    assert widths == [(1, 6), (1, 1), (1, 1), (1, 1)]


def test_a_model_whose_caches_cannot_continue_still_gets_every_steps_positions():
    """A TransformerLM subclass whose caches only have update(): generate keeps giving positions (None would be
    refused: nothing could say where the rows continue)."""
    from attnkit.models.lm import LMConfig, TransformerLM

    class UpdateOnly:
        def __init__(self, inner):
            self.update = inner.update

    class OwnCaches(TransformerLM):
        def new_cache(self, batch_size, **kwargs):
            return [UpdateOnly(c) for c in super().new_cache(batch_size, **kwargs)]

    torch.manual_seed(0)
    config = LMConfig(vocab_size=41, embed_dim=32, num_layers=2, num_heads=4, positions="rope")
    lm = TransformerLM(config).eval()
    own = OwnCaches(config).eval()
    own.load_state_dict(lm.state_dict())
    prompts = [[3, 4, 5, 6], [9, 10]]
    assert generate(own, prompts, max_new_tokens=5) == generate(lm, prompts, max_new_tokens=5)


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_transformer_lm_compiled_decoding_equals_eager_without_recompiles(positions):
    """generate(compile=True): the decode steps of a TransformerLM over a static cache run compiled, the graphs
    reused by every step and by a second call (any recompile is an error); tokens equal eager."""
    from attnkit.models.lm import LMConfig, TransformerLM

    torch.manual_seed(0)
    lm = TransformerLM(LMConfig(vocab_size=41, embed_dim=32, num_layers=2, num_heads=4, num_kv_heads=2, positions=positions,
                                max_seq_len=32)).eval()
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]]
    want = generate(lm, prompts, max_new_tokens=7, cache="static")
    torch.compiler.reset()
    with torch._dynamo.config.patch(error_on_recompile=True):
        got = generate(lm, prompts, max_new_tokens=7, cache="static", compile=True)
        again = generate(lm, [p[::-1] for p in prompts], max_new_tokens=7, cache="static", compile=True)
    assert got == want
    assert again == generate(lm, [p[::-1] for p in prompts], max_new_tokens=7, cache="static")


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"compile": "yes", "cache": "static"}, AttnkitTypeError, "compile must be True or False, got 'yes'"),
    ({"compile": True}, AttnkitValueError, r"compile=True needs cache='static' .*got cache='dynamic'"),
    ({"compile": True, "cache": "static", "prompts": PROMPTS}, NotImplementedError,
     r"compile=True decodes prompts of one length only, got lengths \[2, 4\]"),
])
def test_compiled_generate_errors(model, kwargs, error, match):
    prompts = kwargs.pop("prompts", [[1, 2, 3]])
    with pytest.raises(error, match=match):
        generate(model, prompts, max_new_tokens=2, **kwargs)


def test_the_library_refuses_more_tokens_than_learned_positions_hold():
    """issue 20 item 3: only `attnkit generate` checked the length up front; the library did not."""
    from attnkit.models.builders import build_lm

    model = build_lm("nano", positions="learned", max_seq_len=16).eval()
    with pytest.raises(AttnkitValueError, match=r"max_new_tokens=13 with a prompt of 4 tokens needs 17 positions, but "
                                                r"the model's learned positions hold 16; pass max_new_tokens=12 or less"):
        generate(model, [[1, 2, 3, 4], [5]], max_new_tokens=13)
    assert len(generate(model, [[1, 2, 3, 4]], max_new_tokens=12)[0]) == 12


@pytest.mark.parametrize(("positions", "lab"), [("rope", "RoPE lost 14% at 4x"), ("alibi", "ALiBi stayed flat"),
                                                ("sinusoidal", "sinusoidal positions lost 23%")])
def test_generation_past_the_built_length_warns_with_the_positions_lab_result(positions, lab):
    """issue 23 item 3: computed positions extrapolate (a warning naming the length and the lab's measurement);
    inside the length, no warning."""
    import warnings

    from attnkit.models.builders import build_lm
    from attnkit.models.generation import LengthWarning

    model = build_lm("nano", vocab_size=50, max_seq_len=16, positions=positions).eval()
    with pytest.warns(LengthWarning, match=rf"reaches position 20, past the 16 the model was built for "
                                           rf"\({positions} positions\).*{lab}.*max_new_tokens=12 or less"):
        stream_generate(model, [[1, 2, 3, 4]], max_new_tokens=16)  # warned when called, before any token
    with warnings.catch_warnings():
        warnings.simplefilter("error", LengthWarning)
        assert len(generate(model, [[1, 2, 3, 4]], max_new_tokens=12)[0]) == 12


def test_learned_positions_refuse_when_called_before_any_token():
    from attnkit.models.builders import build_lm

    model = build_lm("nano", vocab_size=50, max_seq_len=16, positions="learned").eval()
    with pytest.raises(AttnkitValueError, match="the model's learned positions hold 16; pass max_new_tokens=12"):
        stream_generate(model, [[1, 2, 3, 4]], max_new_tokens=13)  # no next(): refused at the call


def test_generates_rules_live_once_in_the_library():
    """``attnkit generate`` checks its flags with the library's rules, named as flags (issue 28 item 5): the CLI
    module spells none of the rules itself."""
    import inspect

    from attnkit.cli import generate as cli_generate
    from attnkit.models.generation import check_sampling

    source = inspect.getsource(cli_generate.check_flags)
    assert "check_sampling(" in source and "top_p" in source
    assert not any(rule in source for rule in ("< 0", "< 1", "<= 1", "isfinite", "== 0"))
    flags = {"max_new_tokens": "--max-new-tokens", "temperature": "--temperature", "top_k": "--top-k",
             "top_p": "--top-p"}
    with pytest.raises(AttnkitValueError, match=r"--top-k / --top-p only apply when sampling, but --temperature 0"):
        check_sampling(5, 0.0, 3, None, names=flags.get)
    with pytest.raises(AttnkitValueError, match=r"--max-new-tokens must be >= 0, got -3; e.g. --max-new-tokens 200"):
        check_sampling(-3, 1.0, None, None, names=flags.get)
