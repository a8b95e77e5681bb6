"""Every backend against the float64 reference (docs/conventions.md 2x/3x rule), outputs and gradients.

A backend that can't serve a case must refuse it with reasons when forced; it may never return a wrong answer.

The grid is shaped to stay fast with many backends: every mask on every shape in float32; the low-precision
dtypes on two shapes; options on the masks they interact with; block edges (1, 63, 64, 65, 127, 129, 1000)
with the masks whose tiles change there.

The grid is parametrised by device: on a CUDA machine every case also runs there, with flex in the grid
(forward and backward; SDPA's CUDA kernels); on CPU those cases skip with a reason, and flex runs its own few
small tests (test_flex.py: on CPU it has no backward and compiles for seconds per shape). A refusal is not a
pass: :func:`test_each_backend_serves_its_share` asserts that each backend serves a stated share of the grid.
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit._validation import build_call
from attnkit.errors import BackendUnsupportedError
from oracle import assert_within_rule, run_with_grads

# (B, H, Hkv, Lq, Lk, D): MHA/GQA/MQA, odd head dim, lengths at block edges, Lq != Lk, a decode step
SHAPES = [
    (2, 4, 4, 7, 7, 16),
    (1, 4, 2, 65, 65, 59),
    (2, 4, 1, 63, 129, 32),
    (1, 4, 2, 1, 127, 64),
    (1, 2, 2, 129, 129, 8),
]
SHAPE_IDS = ["mha-7", "gqa-65-d59", "mqa-63x129", "decode-1x127", "mha-129-d8"]


def _lengths(B, Lk, g):
    return torch.randint(1, Lk + 1, (B,), generator=g)


def _left_padded(B, Lk, g):
    pads = torch.randint(0, Lk, (B,), generator=g)
    return torch.arange(Lk)[None, :] >= pads[:, None]  # (B, Lk), True = real


def _docs(B, Lk, g):
    starts = torch.rand(B, Lk, generator=g) < 0.15
    return starts.long().cumsum(-1)  # (B, Lk) non-decreasing document ids


def _random_bool(B, Lq, Lk, g):
    m = torch.rand(B, 1, Lq, Lk, generator=g) < 0.6
    m[:, :, ::5] = False  # every fifth row fully masked
    return m


M = ak.masks
MASKS = {
    "none": lambda B, Lq, Lk, g: None,
    "causal": lambda B, Lq, Lk, g: M.causal(),
    "window5": lambda B, Lq, Lk, g: M.sliding_window(5),
    "pad_lengths": lambda B, Lq, Lk, g: M.padding(_lengths(B, Lk, g)),
    "pad_left_causal": lambda B, Lq, Lk, g: M.padding(_left_padded(B, Lk, g)) & M.causal(),
    "document_causal": lambda B, Lq, Lk, g: M.document(_docs(B, Lk, g)) & M.causal(),
    "strided_causal": lambda B, Lq, Lk, g: M.causal() & M.strided(3),
    "global_window": lambda B, Lq, Lk, g: (M.sliding_window(4) | M.global_tokens([0, 2])) & M.causal(),
    "empty_rows": lambda B, Lq, Lk, g: M.causal() & ~M.sliding_window(2),  # the first rows see nothing
    "bool_tensor": _random_bool,
    "custom_band": lambda B, Lq, Lk, g: M.custom(lambda b, h, q, kv: (kv <= q) & (q - kv < 6), "band6"),
}


def _neginf_rows_bias(B, H, Lq, Lk, g):
    """A float bias that is -inf on whole rows (every fourth) and, on the next rows, at every key a causal row
    sees (an HF 4-D mask built with -inf): those rows see no key under causal masks; 0 rows, finite gradients."""
    bias = torch.randn(1, H, Lq, Lk, generator=g)
    bias[:, :, ::4] = float("-inf")
    seen = torch.arange(Lk)[None, :] <= torch.arange(Lk - Lq, Lk)[:, None]  # (Lq, Lk): causal, bottom-right
    bias[:, :, 1::4] = bias[:, :, 1::4].masked_fill(seen[1::4], float("-inf"))
    return {"bias": bias}

EXTRAS = {
    "plain": lambda B, H, Lq, Lk, g: {},
    "alibi": lambda B, H, Lq, Lk, g: {"bias": ak.positions.ALiBi(H)},
    "float_bias": lambda B, H, Lq, Lk, g: {"bias": torch.randn(1, H, Lq, Lk, generator=g)},
    "bias_neginf_rows": _neginf_rows_bias,
    "softcap": lambda B, H, Lq, Lk, g: {"softcap": 2.0, "scale": 1.0},
    "positions": lambda B, H, Lq, Lk, g: {"kv_positions": torch.arange(Lk) + 100,
                                          "q_positions": torch.arange(Lk - Lq, Lk) + 100},
}

CUDA = torch.cuda.is_available()
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.skipif(
    not CUDA, reason="no CUDA device: the CUDA cases (SDPA's CUDA kernels, flex with backward) run on a CUDA machine"))]
#: backends in the grid per device (flex on CPU: no backward, seconds of compiling per shape; see test_flex.py)
GRID_BACKENDS = {"cpu": [b for b in ak.backends.available() if b != "flex"], "cuda": ak.backends.available()}
BACKENDS = sorted(set(GRID_BACKENDS["cpu"]) | set(GRID_BACKENDS["cuda"]))
#: the share of its grid cases each backend must serve (not refuse), per device: sdpa refuses only softcap
#: (32 of 260 cases), flex only dense float biases (32 of 260), blocksparse, eager and math nothing
SERVED_SHARE = {("cpu", "math"): 1.0, ("cpu", "sdpa"): 0.85, ("cpu", "blocksparse"): 1.0, ("cpu", "eager"): 1.0,
                ("cuda", "math"): 1.0, ("cuda", "sdpa"): 0.85, ("cuda", "blocksparse"): 1.0, ("cuda", "eager"): 1.0,
                ("cuda", "flex"): 0.85}
LOW_DTYPES = [torch.bfloat16, torch.float16]
LOW_SHAPES = ["gqa-65-d59", "mqa-63x129"]
SHAPE_BY_ID = dict(zip(SHAPE_IDS, SHAPES))

# block edges: (B, H, Hkv, L, L, D) with every length where tiles of 64 start, end or straddle
EDGE_LENGTHS = [1, 63, 64, 65, 127, 129, 1000]
EDGE_MASKS = {
    "window_longer_than_seq": lambda B, Lq, Lk, g: M.sliding_window(Lk + 7),
    "window70": lambda B, Lq, Lk, g: M.sliding_window(70),
    "docs_of_length_1": lambda B, Lq, Lk, g: M.document(_short_docs(B, Lk)) & M.causal(),
    "empty_rows": MASKS["empty_rows"],
    "strided_causal": lambda B, Lq, Lk, g: M.causal() & M.strided(5),
    "pad_lengths": MASKS["pad_lengths"],
}


def _short_docs(B, Lk):
    """Documents of lengths 1, 2, 1, 67, 1, 130, ... (many of length 1, some across tile edges)."""
    sizes = torch.tensor([1, 2, 1, 67, 1, 130] * (Lk // 202 + 1))
    return torch.repeat_interleave(torch.arange(sizes.numel()), sizes)[:Lk].expand(B, -1)  # (B, Lk)


def _to(kwargs, dtype):
    return {k: (v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kwargs.items()}


def _case(device, dtype, shape, mask_name, extra_name, seed=0, masks=MASKS):
    """The inputs of one grid case on ``device``: ``q, k, v, mask, kwargs``."""
    B, H, Hkv, Lq, Lk, D = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g).to(device, dtype)
    k = torch.randn(B, Hkv, Lk, D, generator=g).to(device, dtype)
    v = torch.randn(B, Hkv, Lk, D, generator=g).to(device, dtype)
    mask = masks[mask_name](B, Lq, Lk, g)
    mask = mask.to(device) if isinstance(mask, torch.Tensor) else mask  # mask data moves with the call
    kwargs = {name: t.to(device) if isinstance(t, torch.Tensor) else t
              for name, t in EXTRAS[extra_name](B, H, Lq, Lk, g).items()}
    return q, k, v, mask, kwargs


def check_backend(backend, dtype, shape, mask_name, extra_name, seed=0, masks=MASKS, zero_grads="",
                  device="cpu"):
    """``zero_grads``: the letters of the gradients that are exactly 0 in exact arithmetic (a single key: the
    softmax is constant), checked against a rounding-level bound instead of the rule."""
    if backend not in GRID_BACKENDS[device]:
        pytest.skip(f"{backend} is not in the {device} grid (see the module docstring)")
    q, k, v, mask, kwargs = _case(device, dtype, shape, mask_name, extra_name, seed, masks)

    reasons = ak.backends.get(backend).supports(build_call(q, k, v, mask, **kwargs))
    if reasons:  # refusing is not passing: test_each_backend_serves_its_share bounds how often it happens
        with pytest.raises(BackendUnsupportedError, match="can't serve this call"):
            ak.attention(q, k, v, mask, backend=backend, **kwargs)
        return

    out, grads = run_with_grads(lambda q, k, v: ak.attention(q, k, v, mask, backend=backend, **kwargs), [q, k, v])
    ref, ref_grads = run_with_grads(lambda q, k, v: ak.reference_attention(q, k, v, mask, **kwargs), [q, k, v])
    gold, gold_grads = run_with_grads(
        lambda q, k, v: ak.reference_attention(q, k, v, mask, **_to(kwargs, torch.float64)),
        [q.double(), k.double(), v.double()],
    )
    assert out.dtype == dtype
    assert_within_rule(out, ref, gold, what=f"{backend} output")
    for name, got, r, gg in zip("qkv", grads, ref_grads, gold_grads):
        if name in zero_grads:  # exactly 0 in exact arithmetic: a rounding-level bound, not the rule
            scale = float(v.abs().max()) * float(ref.abs().max() + 1)
            assert float(got.abs().max()) <= 16 * torch.finfo(dtype).eps * scale, f"{backend} grad {name} not ~0"
            continue
        assert_within_rule(got, r, gg, factor=3.0, what=f"{backend} grad {name}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_masks_against_reference(device, backend, shape, mask_name):
    check_backend(backend, torch.float32, shape, mask_name, "plain", device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", LOW_DTYPES, ids=str)
@pytest.mark.parametrize("shape_id", LOW_SHAPES)
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_masks_low_precision(device, backend, dtype, shape_id, mask_name):
    check_backend(backend, dtype, SHAPE_BY_ID[shape_id], mask_name, "plain", device=device)


OPTION_GRID = {"dtype": [torch.float32, torch.bfloat16], "shape_id": ["mha-7", "gqa-65-d59", "mqa-63x129", "decode-1x127"],
               "mask_name": ["none", "causal", "window5", "document_causal"],
               "extra_name": [e for e in EXTRAS if e != "plain"]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", OPTION_GRID["dtype"], ids=str)
@pytest.mark.parametrize("shape_id", OPTION_GRID["shape_id"])
@pytest.mark.parametrize("mask_name", OPTION_GRID["mask_name"])
@pytest.mark.parametrize("extra_name", OPTION_GRID["extra_name"])
def test_options_against_reference(device, backend, dtype, shape_id, mask_name, extra_name):
    check_backend(backend, dtype, SHAPE_BY_ID[shape_id], mask_name, extra_name, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("length", EDGE_LENGTHS)
@pytest.mark.parametrize("mask_name", list(EDGE_MASKS))
def test_block_edges(device, backend, length, mask_name):
    shape = (1, 2, 1, length, length, 16) if length > 200 else (2, 4, 2, length, length, 8)
    # with one key (length 1) the softmax is constant, so grads q and k are 0 up to rounding: the 2x rule's floor
    # (relative to |golden| = 0) is below one rounding step of the kernels' backward there
    check_backend(backend, torch.float32, shape, mask_name, "plain", masks=EDGE_MASKS,
                  zero_grads="qk" if length == 1 else "", device=device)


# Lq > Lk under default positions (issue 21 item 11): bottom-right alignment as flash-attn and PyTorch's
# causal_lower_right; the first Lq - Lk queries sit before every key and their rows are 0 with finite gradients.
# Shapes after flash-attn's grid, scaled down: 512x256, 1024x1023, 239x1.
MORE_QUERIES = {"q2x": (1, 4, 2, 96, 48, 16), "q+1": (2, 2, 1, 130, 129, 8), "q239x1": (2, 4, 2, 239, 1, 8)}
MORE_QUERY_MASKS = {
    "none": MASKS["none"],
    "causal": MASKS["causal"],
    "window5": MASKS["window5"],
    "two_sided": lambda B, Lq, Lk, g: M.sliding_window(3, 2),
    "strided_causal": MASKS["strided_causal"],
    "global_window": MASKS["global_window"],
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape_id", list(MORE_QUERIES))
@pytest.mark.parametrize("mask_name", list(MORE_QUERY_MASKS))
@pytest.mark.parametrize("extra_name", ["plain", "alibi", "softcap"])
def test_more_queries_than_keys(device, backend, shape_id, mask_name, extra_name):
    check_backend(backend, torch.float32, MORE_QUERIES[shape_id], mask_name, extra_name, masks=MORE_QUERY_MASKS,
                  zero_grads="qk" if shape_id == "q239x1" else "", device=device)


@pytest.mark.parametrize("backend", GRID_BACKENDS["cpu"])
@pytest.mark.parametrize("mask", [M.causal(), M.sliding_window(4), M.causal() & M.strided(2)], ids=repr)
def test_queries_before_every_key_give_zero_rows_and_zero_grads(backend, mask):
    """The first Lq - Lk rows see no key: output exactly 0, and they pass no gradient to q, k or v."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g).requires_grad_() for n in (40, 16, 16))
    out = ak.attention(q, k, v, mask, bias=ak.positions.ALiBi(2), backend=backend)
    assert torch.equal(out[:, :, :24], torch.zeros_like(out[:, :, :24]))
    assert torch.isfinite(out).all() and out[:, :, 24:].abs().sum() > 0
    out[:, :, :24].sum().backward()  # only the empty rows: every gradient is 0
    for t in (q, k, v):
        assert torch.equal(t.grad, torch.zeros_like(t.grad)), f"{backend}: an empty row passed a gradient"


def _grid_cases():
    """Every (dtype, shape, mask, extra, masks) case of the four grids above."""
    for shape in SHAPES:
        for mask_name in MASKS:
            yield torch.float32, shape, mask_name, "plain", MASKS
    for dtype in LOW_DTYPES:
        for shape_id in LOW_SHAPES:
            for mask_name in MASKS:
                yield dtype, SHAPE_BY_ID[shape_id], mask_name, "plain", MASKS
    for dtype in OPTION_GRID["dtype"]:
        for shape_id in OPTION_GRID["shape_id"]:
            for mask_name in OPTION_GRID["mask_name"]:
                for extra_name in OPTION_GRID["extra_name"]:
                    yield dtype, SHAPE_BY_ID[shape_id], mask_name, extra_name, MASKS
    for length in EDGE_LENGTHS:
        for mask_name in EDGE_MASKS:
            shape = (1, 2, 1, length, length, 16) if length > 200 else (2, 4, 2, length, length, 8)
            yield torch.float32, shape, mask_name, "plain", EDGE_MASKS


@pytest.mark.parametrize("device", DEVICES)
def test_each_backend_serves_its_share(device):
    """A refusal is not a pass: each backend in the grid serves at least its stated share of the cases (asked
    by ``supports``, exactly as the grid tests ask before they run or expect a refusal)."""
    served = {b: 0 for b in GRID_BACKENDS[device]}
    total = 0
    with torch.enable_grad():
        for dtype, shape, mask_name, extra_name, masks in _grid_cases():
            q, k, v, mask, kwargs = _case(device, dtype, shape, mask_name, extra_name, masks=masks)
            call = build_call(*(t.requires_grad_() for t in (q, k, v)), mask, **kwargs)  # the grid runs with grads
            total += 1
            for b in served:
                served[b] += not ak.backends.get(b).supports(call)
    for b, n in served.items():
        want = SERVED_SHARE[(device, b)]
        assert n >= want * total, f"{b} on {device} serves {n} of {total} grid cases ({n / total:.0%}), below {want:.0%}"


# Decode-sized GQA in float32 with sharp softmaxes (issue 33 item 4): logits of standard deviation 4-8 (scale 0.5
# and 1 at D = 64, as a trained model's), where how a kernel sums a decode step's few dot products shows; 8/2 heads
DECODE_GQA = {f"gqa-decode-{lq}x300": (1, 8, 2, lq, 300, 64) for lq in (1, 2, 4, 16)}
DECODE_MASKS = {"none": MASKS["none"], "causal": MASKS["causal"], "window32": lambda B, Lq, Lk, g: M.sliding_window(32)}
SHARP = {"sharp4": {"scale": 0.5}, "sharp8": {"scale": 1.0}}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape_id", list(DECODE_GQA))
@pytest.mark.parametrize("mask_name", list(DECODE_MASKS))
@pytest.mark.parametrize("sharp", list(SHARP))
@pytest.mark.parametrize("seed", range(3))
def test_decode_gqa_float32_sharp_softmax(device, backend, shape_id, mask_name, sharp, seed, monkeypatch):
    monkeypatch.setitem(EXTRAS, sharp, lambda B, H, Lq, Lk, g: dict(SHARP[sharp]))
    check_backend(backend, torch.float32, DECODE_GQA[shape_id], mask_name, sharp, seed=seed, masks=DECODE_MASKS,
                  device=device)


def _float_band(b, h, q, kv):
    return ((kv <= q) & (q - kv < 6)).float()  # 0/1 floats: the bool mask's values, in the wrong dtype


def _int_band(b, h, q, kv):
    return ((kv <= q) & (q - kv < 6)).long()


@pytest.mark.parametrize("backend", ["reference"] + GRID_BACKENDS["cpu"])
@pytest.mark.parametrize("fn", [_float_band, _int_band], ids=["float", "int"])
def test_custom_masks_of_numbers_are_one_typed_refusal(backend, fn):
    """A custom mask fn returning 0/1 numbers instead of bools (SDPA read them as a bias, the block cover as
    truth values, math as a bitwise ~): the same TypeError, naming the fn and the fix, on every backend."""
    q, k, v = (torch.randn(1, 4, 20, 16) for _ in range(3))
    run = ak.reference_attention if backend == "reference" else \
        lambda *a: ak.attention(*a, backend=backend)
    with pytest.raises(ak.errors.AttnkitTypeError,
                       match=rf"custom mask fn '{fn.__name__}' must return a bool tensor \(True = may attend\), got "
                             r"tensor\(.*dtype=torch\.(float32|int64).*pass additive float scores as bias="):
        run(q, k, v, M.custom(fn))
    with pytest.raises(ak.errors.AttnkitTypeError, match=rf"custom mask fn '{fn.__name__}' must return a bool"):
        run(q, k, v, M.prepare(M.custom(fn), 20))  # prepared once per forward, as a model does: the same refusal


# Attention sinks (gpt-oss, issue 32 item 3): every backend that declares them, every mask kind, float32 and bf16,
# outputs and the gradients of q, k, v and the sinks against the float64 reference; rows that see no key stay 0
SINK_SHAPES = {"gqa-65-d59": SHAPE_BY_ID["gqa-65-d59"], "mqa-63x129": SHAPE_BY_ID["mqa-63x129"],
               "decode-1x127": SHAPE_BY_ID["decode-1x127"]}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("shape_id", list(SINK_SHAPES))
@pytest.mark.parametrize("mask_name", list(MASKS))
def test_sinks_against_reference(device, backend, dtype, shape_id, mask_name):
    if backend not in GRID_BACKENDS[device]:
        pytest.skip(f"{backend} is not in the {device} grid (see the module docstring)")
    q, k, v, mask, _ = _case(device, dtype, SINK_SHAPES[shape_id], mask_name, "plain")
    H = q.shape[1]
    sinks = (torch.randn(H, generator=torch.Generator().manual_seed(3)) * 2).to(device, dtype)  # some take real mass
    reasons = ak.backends.get(backend).supports(build_call(q, k, v, mask, sinks=sinks))
    if reasons:
        with pytest.raises(BackendUnsupportedError, match="can't serve this call"):
            ak.attention(q, k, v, mask, sinks=sinks, backend=backend)
        assert device != "cpu" or backend == "flex", f"{backend} refused sinks on the CPU: {reasons}"
        return
    out, grads = run_with_grads(lambda q, k, v, s: ak.attention(q, k, v, mask, sinks=s, backend=backend),
                                [q, k, v, sinks])
    ref, ref_grads = run_with_grads(lambda q, k, v, s: ak.reference_attention(q, k, v, mask, sinks=s), [q, k, v, sinks])
    gold, gold_grads = run_with_grads(lambda q, k, v, s: ak.reference_attention(q, k, v, mask, sinks=s),
                                      [t.double() for t in (q, k, v, sinks)])
    assert out.dtype == dtype
    assert_within_rule(out, ref, gold, what=f"{backend} output with sinks")
    for name, got, r, gg in zip(("q", "k", "v", "sinks"), grads, ref_grads, gold_grads):
        assert_within_rule(got, r, gg, factor=3.0, what=f"{backend} grad {name} with sinks")
    empty = (gold == 0).all(dim=-1)  # (B, H, Lq): rows that see no key
    assert torch.equal(out[empty], torch.zeros_like(out[empty])), f"{backend}: a row that sees no key is not 0"
