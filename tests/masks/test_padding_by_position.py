"""Padding by position and chunks from a start (issue 28.4): the kinds that replace the custom masks generation
built for left padding and the Hugging Face bridge built for ``padding_mask_function`` and ``chunked_overlay``.

Each new kind equals, element for element, the custom mask it replaces (the old formulas are written out here),
on positions a cache may hand out in any order; each has a block cover (never probed) that lets blocksparse skip
the padded blocks; every backend serves them within the tolerance rule of docs/conventions.md.
"""

from __future__ import annotations

import pytest
import torch

import attnkit as ak
from attnkit._validation import build_call
from attnkit.backends.blocksparse import make_plans
from attnkit.errors import AttnkitValueError
from attnkit.masks import blocks
from attnkit.masks.blocks import cover, probe
from attnkit.models.generation import left_pad, padding_by_position
from oracle import assert_within_rule

M = ak.masks


def _old_left_padding(key_is_real, positions):
    """generation.padding_by_position as it was: a custom mask ``kv_pos >= start[b]``."""
    n_pads = (~key_is_real).sum(dim=1)  # (B,)
    start = positions[:, -1] - (key_is_real.shape[1] - 1) + n_pads  # (B,)
    return M.custom(lambda b, h, q_pos, kv_pos: kv_pos >= start[b], "left_padding")


def _old_hf_padding(real):
    """integrations/hf/masks.py's reading of padding_mask_function as it was: ``real[b, kv_pos]``."""
    return M.custom(lambda b, h, q, kv: real.to(kv.device)[b, kv], name="padding_by_index")


def _old_hf_chunk(chunk, lp):
    """integrations/hf/masks.py's reading of chunked_overlay as it was (with causal: chunked_causal_mask_function)."""
    def same_chunk(b, h, q, kv):
        shift = lp.to(q.device)[b]
        return torch.div(kv - shift, chunk, rounding_mode="floor") == torch.div(q - shift, chunk, rounding_mode="floor")

    return M.custom(same_chunk, name=f"chunked({chunk})") & M.causal()


def _shuffled_keys(n_real_rows, total, generator):
    """Key positions (B, total) as a ring cache might return them: a rotation of consecutive positions, pads
    negative."""
    rows = []
    for n_pads in n_real_rows:
        pos = torch.arange(total) - n_pads  # (total,) pads at negative positions
        rows.append(torch.roll(pos, int(torch.randint(total, (1,), generator=generator))))
    return torch.stack(rows)  # (B, total)


@pytest.mark.parametrize("seed", range(4))
def test_padding_start_equals_the_custom_left_padding_it_replaces(seed):
    g = torch.Generator().manual_seed(seed)
    prompts = [list(range(int(n))) for n in torch.randint(1, 12, (3,), generator=g)]
    _, positions, key_is_real = left_pad(prompts)  # (B, P) each
    steps = int(torch.randint(0, 5, (1,), generator=g))  # decode steps after the prompt: the keys grow
    real = torch.cat([key_is_real, key_is_real.new_ones(3, steps)], dim=1)  # (B, P + steps)
    q_pos = positions[:, -1:] + steps  # (B, 1) the newest token
    kv_pos = torch.cat([positions, positions[:, -1:] + torch.arange(1, steps + 1)], dim=1)  # (B, P + steps)
    new, old = padding_by_position(real, q_pos), _old_left_padding(real, q_pos)
    assert new.kind == "padding_by_position" and new.batch == 3
    for kv in (kv_pos, _shuffled_keys((~real).sum(1).tolist(), real.shape[1], g)):
        assert torch.equal(new.to_dense(q_pos, kv), old.to_dense(q_pos, kv))
        prefill_q = kv  # a prefill: every token a query
        assert torch.equal((M.causal() & new).to_dense(prefill_q, kv), (M.causal() & old).to_dense(prefill_q, kv))


def test_padding_start_is_the_start_rule():
    start = torch.tensor([0, 3, -2])
    kv = torch.arange(-4, 6)[None].expand(3, -1)  # (3, 10)
    got = M.padding(start=start).to_dense(kv[:, -2:], kv)[:, 0]  # (3, 2, 10)
    assert torch.equal(got, (kv >= start[:, None])[:, None, :].expand(3, 2, 10))


@pytest.mark.parametrize("seed", range(3))
def test_padding_by_position_table_equals_hf_padding_function_custom(seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(2, 12, generator=g) > 0.3  # (B, N) any layout
    kv = torch.stack([torch.randperm(12, generator=g)[:9] for _ in range(2)])  # (B, 9) positions in any order
    q = kv[:, -4:]
    new, old = M.padding(table, by="position"), _old_hf_padding(table)
    assert torch.equal(new.to_dense(q, kv), old.to_dense(q, kv))
    assert torch.equal(new.to_dense(12), table[:, None, None, :].expand(2, 1, 12, 12))


@pytest.mark.parametrize("q_offset", [0, 5])
def test_chunked_from_a_start_equals_hf_chunk_overlay_custom(q_offset):
    lp = torch.tensor([0, 3, 6])
    kv = torch.arange(20)[None]  # (1, 20)
    q = kv[:, q_offset:]
    assert torch.equal(M.chunked(4, start=lp).to_dense(q, kv, batch=3), _old_hf_chunk(4, lp).to_dense(q, kv, batch=3))
    assert torch.equal(M.chunked(4, start=torch.zeros(3, dtype=torch.long)).to_dense(20, batch=3),
                       M.chunked(4).to_dense(20, batch=3))  # start 0: the plain kind
    assert M.chunked(4, start=lp).reach() == (-3, 0) and M.chunked(4, start=lp).batch == 3


def test_hf_mask_interface_reads_padding_and_chunks_as_kinds_equal_to_transformers():
    tf = pytest.importorskip("transformers.masking_utils")
    from attnkit.integrations.hf.masks import mask_interface

    lp = torch.tensor([0, 2, 5])
    pm = torch.ones(3, 16, dtype=torch.bool)
    pm[1, :2], pm[2, :5], pm[0, 9] = False, False, False  # left padding, and a hole
    for fn in (tf.chunked_causal_mask_function(4, lp),
               tf.and_masks(tf.causal_mask_function, tf.padding_mask_function(pm)),
               tf.and_masks(tf.chunked_causal_mask_function(4, lp), tf.padding_mask_function(pm))):
        for q_len, q_offset in ((16, 0), (3, 13)):
            got = mask_interface(3, q_len, 16, q_offset=q_offset, mask_function=fn)
            assert got.dense_reason is None and "custom" not in {p.kind for p in got.spec.leaves()}, got.spec
            want = tf.sdpa_mask(batch_size=3, q_length=q_len, kv_length=16, q_offset=q_offset, mask_function=fn,
                                allow_is_causal_skip=False)  # (3, 1, Lq, 16)
            q_pos = q_len if got.q_positions is None else got.q_positions
            kv_pos = 16 if got.kv_positions is None else got.kv_positions
            assert torch.equal(got.spec.to_dense(q_pos, kv_pos, batch=3), want), (fn, q_len)


KINDS = {
    "padding(start)": M.causal() & M.padding(start=torch.tensor([0, 7])),
    "padding(table, by=position)": M.padding(torch.rand(2, 30) > 0.4, by="position"),
    "chunked(start)": M.chunked(6, start=torch.tensor([1, 4])),
}


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("shift", [0, 5])
def test_covers_are_safe_and_never_probed(name, shift, monkeypatch):
    mask = KINDS[name]
    kv = torch.arange(20) + shift
    pm = M.prepare(mask, kv[-13:], kv, batch=2)
    for block in (1, 3, 4, 7):
        truth = probe(mask, pm.grid(block))
        with monkeypatch.context() as patch:
            patch.setattr(blocks, "probe", lambda m, g: pytest.fail(f"{m!r} fell back to per-element probing"))
            got = cover(mask, pm.grid(block))
        assert not (truth.any & ~got.any).any() and not (got.full & ~truth.full).any(), (name, block)


def test_blocksparse_skips_the_left_padding():
    """Left padding by position: the padded keys' blocks are skipped, as padding by index skips them."""
    L, pads = 512, 256
    q = torch.randn(1, 2, L, 16)
    by_position = M.causal() & M.padding(start=torch.tensor([pads]))
    by_index = M.causal() & M.padding(torch.arange(L)[None] >= pads)
    causal = make_plans(build_call(q, q, q, M.causal()))[0].density()
    got = make_plans(build_call(q, q, q, by_position))[0].density()
    assert got == make_plans(build_call(q, q, q, by_index))[0].density() < causal


@pytest.mark.parametrize("backend", ["math", "sdpa", "blocksparse", "eager"])
@pytest.mark.parametrize("name", list(KINDS))
def test_every_backend_serves_the_new_kinds(backend, name, dtype=torch.float32):
    mask = KINDS[name]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 30, 16, generator=g, dtype=torch.float64) for _ in range(3))
    golden = ak.attention(q, k, v, mask, backend="math")
    ref_t = ak.attention(*(t.to(dtype) for t in (q, k, v)), mask, backend="math")
    got = ak.attention(*(t.to(dtype) for t in (q, k, v)), mask, backend=backend)
    assert_within_rule(got, ref_t, golden, what=f"{backend} {name}")


def test_errors():
    with pytest.raises(AttnkitValueError, match=r"padding\(\) needs key_is_real \(B, Lk\) bool, lengths \(B,\) or "):
        M.padding()
    with pytest.raises(AttnkitValueError, match=r"padding\(by=...\) must be 'index' or 'position', got 'rows'"):
        M.padding(torch.ones(1, 3, dtype=torch.bool), by="rows")
    with pytest.raises(AttnkitValueError, match=r"padding\(start=...\) takes no key_is_real and no by="):
        M.padding(torch.ones(1, 3, dtype=torch.bool), start=[0])
    with pytest.raises(AttnkitValueError, match=r"padding by position takes start=... \(B,\) or a key_is_real table"):
        M.padding(by="position")
    with pytest.raises(AttnkitValueError, match=r"start must be ints \(B,\), the position of each row's first real"):
        M.padding(start=[0.5])
    with pytest.raises(AttnkitValueError, match=r"start must be ints \(B,\), the position each row's chunks start"):
        M.chunked(4, start=torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(AttnkitValueError, match=r"expects a bool tensor \(B, N\) indexed by key position"):
        M.padding(torch.ones(1, 3), by="position")
    with pytest.raises(AttnkitValueError, match=r"covers positions 0..2 but the call's keys sit at positions 0..4"):
        M.padding(torch.ones(1, 3, dtype=torch.bool), by="position").to_dense(5)
    with pytest.raises(AttnkitValueError, match=r"batch sizes disagree: positions 1/1, mask data 2, batch=3"):
        M.chunked(4, start=[0, 1]).to_dense(5, batch=3)
    assert repr(M.padding(start=[0, 2])) == "padding(start=[0, 2])"
    assert repr(M.chunked(4, start=[1])) == "chunked(4, start=[1])"
