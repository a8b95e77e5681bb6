"""Cache unit behaviour: returned positions, fixed shapes, O(W) memory, and every typed error."""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit.cache import EMPTY_POSITION, CacheFullError, DynamicCache, KVCache, SlidingWindowCache, StaticCache, make_cache
from attnkit.errors import AttnkitTypeError, AttnkitValueError

M = ak.masks


def kv(B=2, Hkv=2, n=1, D=4):
    return torch.randn(B, Hkv, n, D), torch.randn(B, Hkv, n, D)


def pos(start, n):
    return torch.arange(start, start + n)[None]  # (1, n)


@pytest.mark.parametrize("kind", ["dynamic", "static", "sliding"])
def test_caches_implement_the_protocol(kind):
    cache = make_cache(kind, 2, 2, 4, max_length=8, window=4)
    assert isinstance(cache, KVCache)
    k, v = kv(n=3)
    k_all, v_all, kv_pos = cache.update(k, v, pos(0, 3))
    assert k_all.shape[:2] == (2, 2) and k_all.shape[2] == kv_pos.shape[1] and v_all.shape == k_all.shape
    assert cache.length == 3


def test_dynamic_cache_returns_everything_in_order_and_grows():
    cache = DynamicCache(2, 2, 4, initial_capacity=2)
    ks = []
    for start, n in ((0, 3), (3, 1), (4, 5)):
        k, v = kv(n=n)
        ks.append(k)
        k_all, v_all, kv_pos = cache.update(k, v, pos(start, n))
    assert torch.equal(k_all, torch.cat(ks, dim=2))
    assert torch.equal(kv_pos, torch.arange(9).expand(2, 9))


def test_static_cache_has_fixed_shapes_and_hides_empty_slots():
    cache = StaticCache(2, 2, 4, max_length=6)
    k, v = kv(n=2)
    k_all, _, kv_pos = cache.update(k, v, pos(0, 2))
    assert k_all.shape == (2, 2, 6, 4) and kv_pos.shape == (2, 6)
    assert (kv_pos[:, 2:] == EMPTY_POSITION).all() and torch.equal(k_all[:, :, :2], k)
    k_all2, _, _ = cache.update(*kv(n=1), pos(2, 1))
    assert k_all2.shape == k_all.shape  # same shapes every step
    assert not M.causal().to_dense(torch.tensor([[2]]), kv_pos[:1])[..., 3:].any()


def test_static_cache_decode_view_is_the_filled_slots_without_a_mask_in_eager(monkeypatch):
    """Eager one-token steps attend to the filled slots only, causal mask dropped (old: every slot under a mask
    built per layer per step); index-defined masks (sized to max_length) and compiled steps keep every slot."""
    cache = StaticCache(2, 2, 4, max_length=6)
    ks = [kv(n=2), kv(n=1)]
    cache.update(*ks[0], pos(0, 2))
    k_all, v_all, kv_pos = cache.update(*ks[1], pos(2, 1))
    k, v, p, mask = cache.decode_view(k_all, v_all, kv_pos, M.causal())
    assert mask is None and k.shape == (2, 2, 3, 4) and torch.equal(k, torch.cat([ks[0][0], ks[1][0]], dim=2))
    assert torch.equal(v, torch.cat([ks[0][1], ks[1][1]], dim=2)) and p.tolist() == [[0, 1, 2]] * 2
    window = M.sliding_window(2)
    assert cache.decode_view(k_all, v_all, kv_pos, window)[3] is window  # still needed: it hides slot 0
    padded = M.causal() & M.padding(torch.ones(2, 6, dtype=torch.bool))
    k, _, _, mask = cache.decode_view(k_all, v_all, kv_pos, padded)
    assert k.shape[2] == 6 and mask is padded
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    k, _, _, mask = cache.decode_view(k_all, v_all, kv_pos, M.causal())
    assert k.shape[2] == 6 and mask is not None


def test_sliding_cache_is_a_ring_of_w_slots():
    W = 3
    cache = SlidingWindowCache(1, 1, 2, window=W)
    memory = cache.memory_bytes()
    for t in range(10):
        k = torch.full((1, 1, 1, 2), float(t))
        k_all, _, kv_pos = cache.update(k, k.clone(), pos(t, 1))
        want = list(range(max(0, t - W + 1), t + 1))
        assert sorted(kv_pos[0].tolist()) == want  # the last W positions, in ring order
        assert sorted(k_all[0, 0, :, 0].tolist()) == [float(p) for p in want]  # keys match their positions
    assert cache.memory_bytes() == memory  # O(W): nothing grows


def test_sliding_cache_chunk_across_the_wrap_returns_old_and_new_keys():
    cache = SlidingWindowCache(1, 1, 2, window=4)
    cache.update(*kv(1, 1, 6, 2), pos(0, 6))
    _, _, kv_pos = cache.update(*kv(1, 1, 5, 2), pos(6, 5))
    assert sorted(kv_pos[0].tolist()) == list(range(2, 11))  # 4 stored + 5 new: what queries 6..10 need
    _, _, kv_pos = cache.update(*kv(1, 1, 1, 2), pos(11, 1))
    assert sorted(kv_pos[0].tolist()) == [8, 9, 10, 11]


def test_reset_starts_a_new_sequence():
    cache = StaticCache(1, 1, 2, max_length=3)
    cache.update(*kv(1, 1, 3, 2), pos(0, 3))
    cache.reset()
    _, _, kv_pos = cache.update(*kv(1, 1, 1, 2), pos(0, 1))
    assert kv_pos[0].tolist() == [0, EMPTY_POSITION, EMPTY_POSITION]


# ----------------------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((kv(Hkv=4), pos(0, 1)), AttnkitValueError, r"GQA caches store the Hkv key/value heads \(not H\)"),
        ((kv(B=3), pos(0, 1)), AttnkitValueError, r"k must have shape \(B=2, Hkv=2, Lnew, D=4\)"),
        ((kv(D=5), pos(0, 1)), AttnkitValueError, "D=4"),
        (((torch.randn(2, 2, 1, 4).double(), torch.randn(2, 2, 1, 4).double()), pos(0, 1)), AttnkitTypeError,
         "k has dtype torch.float64 but the cache stores torch.float32"),
        (((torch.randn(2, 2, 1, 4), torch.randn(2, 2, 2, 4)), pos(0, 1)), AttnkitValueError, "must have the same shape"),
        (((torch.randn(2, 2, 1, 4), [1.0]), pos(0, 1)), AttnkitTypeError, "v must be a torch.Tensor"),
        ((kv(n=0), pos(0, 0)), AttnkitValueError, "Lnew=0"),
        ((kv(), torch.tensor([[0.0]])), AttnkitTypeError, "positions must be an integer tensor of absolute positions"),
        ((kv(), torch.tensor([0])), AttnkitValueError, r"positions must have shape \(1, 1\) or \(2, 1\)"),
        ((kv(n=3), torch.tensor([[0, 1, 3]])), AttnkitValueError, "positions must be consecutive within an update"),
        (((torch.randn(2, 2, 1, 4, device="meta"),) * 2, pos(0, 1)), AttnkitValueError,
         "k is on meta but the cache is on cpu"),
        ((kv(), torch.tensor([[0]], device="meta")), AttnkitValueError, "positions is on meta"),
    ],
)
def test_update_errors(args, error, match):
    (k, v), positions = args
    cache = DynamicCache(2, 2, 4)
    with pytest.raises(error, match=match):
        cache.update(k, v, positions)


@pytest.mark.parametrize("bad", [pos(5, 1), pos(2, 1), torch.tensor([[3, 4]])[:, :1] - 1, torch.tensor([[3], [4]])])
def test_positions_must_continue_the_sequence(bad):
    """Feeding a token twice, skipping one, or out of order would silently corrupt the keys: it raises."""
    cache = DynamicCache(2, 2, 4)
    cache.update(*kv(n=3), pos(0, 3))
    with pytest.raises(AttnkitValueError, match=r"positions must continue the cached sequence: expected \[\[3\], \[3\]\]"):
        cache.update(*kv(), bad)


def test_static_cache_full_raises_instead_of_dropping():
    cache = StaticCache(2, 2, 4, max_length=4)
    cache.update(*kv(n=3), pos(0, 3))
    with pytest.raises(CacheFullError, match=r"static cache is full: it holds max_length=4 tokens, has 3 and got 2"):
        cache.update(*kv(n=2), pos(3, 2))
    assert issubclass(CacheFullError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"kind": "paged"}, AttnkitValueError, "cache kind must be one of"),
        ({"kind": "static"}, AttnkitValueError, "kind='static' needs max_length"),
        ({"kind": "sliding"}, AttnkitValueError, "kind='sliding' needs window"),
        ({"kind": "dynamic", "batch_size": 0}, AttnkitValueError, "batch_size must be a positive int"),
        ({"kind": "static", "max_length": 0}, AttnkitValueError, "max_length must be a positive int"),
        ({"kind": "dynamic", "dtype": torch.int64}, AttnkitTypeError, "dtype must be a floating-point torch.dtype"),
    ],
)
def test_make_cache_errors(kwargs, error, match):
    args = {"batch_size": 1, "num_kv_heads": 2, "head_dim": 4}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        make_cache(args.pop("kind"), args.pop("batch_size"), args.pop("num_kv_heads"), args.pop("head_dim"), **args)


# ----------------------------------------------------------------------------------- with the attention module


class _UpdateOnly:
    """A cache with nothing but the protocol's update: it cannot say where its sequence continues."""

    def __init__(self):
        self.inner = DynamicCache(1, 2, 4)

    def update(self, k, v, positions):
        return self.inner.update(k, v, positions)


def test_module_with_cache_needs_positions_a_causal_mask_and_a_cache():
    mha = ak.nn.MultiHeadAttention(16, 4, num_kv_heads=2)
    x = torch.randn(1, 3, 16)
    cache = DynamicCache(1, 2, 4)
    with pytest.raises(AttnkitValueError, match=r"positions must be given with cache= when the cache cannot say where "
                                                r"its sequence continues \(no next_positions\(n\): _UpdateOnly\)"):
        mha(x, M.causal(), cache=_UpdateOnly())
    with pytest.raises(AttnkitValueError, match="with a KV cache the mask must be causal, got mask=None"):
        mha(x, None, positions=pos(0, 3), cache=cache)
    with pytest.raises(AttnkitValueError, match="with a KV cache the mask must be causal"):
        mha(x, M.padding(torch.tensor([3])), positions=pos(0, 3), cache=cache)
    with pytest.raises(AttnkitTypeError, match="cache must be a KV cache with update"):
        mha(x, M.causal(), positions=pos(0, 3), cache=[cache])


@pytest.mark.parametrize("kind", ["dynamic", "static", "sliding"])
def test_module_without_positions_continues_its_cache_with_no_position_checks(kind, monkeypatch):
    """positions=None with an attnkit cache: the cache's own next positions (after an offset prefill too), equal to
    passing them, and the update trusts what the cache issued (no torch.equal: a host sync per layer on CUDA)."""
    torch.manual_seed(0)
    mha = ak.nn.MultiHeadAttention(16, 4, num_kv_heads=2, positions="rope").eval()
    x = torch.randn(2, 6, 16)
    mask = M.sliding_window(4) if kind == "sliding" else M.causal()
    given, free = (make_cache(kind, 2, 2, 4, max_length=8, window=4) for _ in range(2))
    start = torch.tensor([[5], [9]])  # rows at different absolute offsets
    for cache in (given, free):
        mha(x[:, :3], mask, positions=start + torch.arange(3), cache=cache)
    equal_calls = []
    real_equal = torch.equal
    monkeypatch.setattr(torch, "equal", lambda *a: equal_calls.append(1) or real_equal(*a))
    for t in range(3, 6):
        want = mha(x[:, t:t + 1], mask, positions=start + t, cache=given)
        calls = len(equal_calls)
        got = mha(x[:, t:t + 1], mask, cache=free)
        assert len(equal_calls) == calls  # nothing compared for the cache's own positions
        assert torch.equal(got, want)
    assert equal_calls  # the given positions were checked
    assert torch.equal(free.next_positions(1), start + 6)


@pytest.mark.parametrize("mask", [M.causal(), M.sliding_window(5), M.sliding_window(2) | M.global_tokens([0])])
def test_sliding_cache_refuses_masks_that_reach_beyond_its_window(mask):
    mha = ak.nn.MultiHeadAttention(16, 4)
    cache = SlidingWindowCache(1, 4, 4, window=4)
    with pytest.raises(AttnkitValueError, match="holds only the last 4 keys"):
        mha(torch.randn(1, 2, 16), mask & M.causal(), positions=pos(0, 2), cache=cache)


def test_module_cache_gets_hkv_heads_after_rope():
    """The cache stores the Hkv rotated keys: its keys equal the module's own projection at those positions."""
    mha = ak.nn.MultiHeadAttention(16, 4, num_kv_heads=1, positions="rope")
    cache = DynamicCache(1, 1, 4)
    x = torch.randn(1, 5, 16)
    mha(x, M.causal(), positions=pos(10, 5), cache=cache)
    _, k, _ = mha.project(x, pos(10, 5))
    torch.testing.assert_close(cache.k[:, :, :5], k)


def test_decode_step_passes_no_mask_to_the_backend():
    """A single newest query over a dynamic cache with a causal mask runs SDPA with no mask at all."""
    from attnkit._hooks import add_observer, remove_observer

    mha = ak.nn.MultiHeadAttention(16, 4)
    cache = DynamicCache(1, 4, 4)
    seen = []

    def observe(call, out):
        seen.append(call)

    add_observer(observe)
    try:
        mha(torch.randn(1, 3, 16), M.causal(), positions=pos(0, 3), cache=cache)
        mha(torch.randn(1, 1, 16), M.causal(), positions=pos(3, 1), cache=cache)
        mha(torch.randn(1, 2, 16), M.causal(), positions=pos(4, 2), cache=cache)
    finally:
        remove_observer(observe)
    prefill, step, chunk = seen
    assert prefill.mask is not None and prefill.kv_positions is not None
    assert step.mask is None and step.default_positions and step.kv_len == 4
    # a chunk (Lq=2 < Lk=6) keeps its mask on explicit positions: SDPA's top-left is_causal cannot be chosen
    assert chunk.mask is not None and chunk.q_positions.tolist() == [[4, 5]] and chunk.kv_len == 6


def test_static_cache_decode_step_compiles_to_one_graph():
    """torch.compile-friendly: every decode step over a static cache reuses one captured graph."""
    from cache.tiny_decoder import TinyDecoder

    torch._dynamo.reset()
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = TinyDecoder(positions="rope", layers=1).eval()
    cache = model.new_cache(1, kind="static", max_length=12)
    tokens = torch.randint(0, 53, (1, 10))
    step = torch.compile(lambda t, p: model(t, positions=p, cache=cache), backend=counting_backend)
    with torch.no_grad():
        full = model(tokens)
        model(tokens[:, :4], positions=pos(0, 4), cache=cache)
        steps = [step(tokens[:, i:i + 1], pos(i, 1)) for i in range(4, 10)]
    assert float((torch.cat(steps, 1) - full[:, 4:]).abs().max()) <= 1e-5
    assert len(graphs) == 1, f"{len(graphs)} graphs for 6 decode steps"
    assert cache[0].length == 10


@pytest.mark.parametrize("kind", ["dynamic", "static", "sliding"])
def test_positions_already_int64_skip_only_the_conversion(kind):
    """Positions already int64 (1|B, Lnew) on the cache's device skip position_ids' conversion; every other form
    is still converted (int32) or refused (an int64 batch that does not fit), and the continuity check stays."""
    cache = make_cache(kind, 2, 2, 4, max_length=8, window=4)
    cache.update(*kv(n=2), torch.tensor([[0, 1]], dtype=torch.int32))
    assert cache.positions.dtype == torch.long
    with pytest.raises(AttnkitValueError, match=r"positions must have shape \(1, 1\) or \(2, 1\)"):
        cache.update(*kv(), torch.tensor([[2], [2], [2]]))
    with pytest.raises(AttnkitValueError, match=r"positions must continue the cached sequence: expected \[\[2\], \[2\]\]"):
        cache.update(*kv(), torch.tensor([[3]]))
    cache.update(*kv(), torch.tensor([[2]]))
    assert cache.length == 3


def test_static_cache_eager_updates_read_no_cursor_from_the_device():
    """The cursor lives on the device (one compiled graph serves every step); eager updates keep its value on the
    host, so an eager decode step needs no host sync (int(cursor) is one per layer per step on CUDA), and the
    full-cache check still fires."""
    reads = []

    class Cursor(torch.Tensor):
        def __int__(self):
            reads.append(1)
            return super().__int__()

    cache = StaticCache(2, 2, 4, max_length=4)
    cache._cursor = cache._cursor.as_subclass(Cursor)
    cache.update(*kv(n=2), pos(0, 2))
    cache.update(*kv(), pos(2, 1))
    assert cache.length == 3 and reads == []
    with pytest.raises(CacheFullError, match=r"holds max_length=4 tokens, has 3 and got 2"):
        cache.update(*kv(n=2), pos(3, 2))
    cache._host_length = None  # as after a compiled step: the value is read back once
    assert cache.length == 3 and reads == [1]
    cache.reset()
    assert cache.length == 0 and reads == [1]
