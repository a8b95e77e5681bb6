"""``attnkit tour`` (alias ``attnkit demo``): attention with several masks and positions; which backend served
each call and why, its error against the float64 reference, and the masks as pictures. (``make demo`` is
something else: it trains a small model and writes its report.)"""

from __future__ import annotations

import torch

import attnkit as ak

M = ak.masks


#: the lengths the tour takes: every mask is drawn as an L x L picture, one character per entry
MIN_LENGTH, MAX_LENGTH = 1, 128


def cases(L: int):
    docs = (3 * torch.arange(L))[None, :] // L  # (1, L): three packed documents (fewer when L < 3)
    real = torch.arange(L)[None, :] >= L // 4  # (1, L): a quarter of left-padding tokens
    return [
        ("causal", M.causal(), {}),
        ("sliding window 4", M.sliding_window(4), {}),
        ("packed documents", M.document(docs) & M.causal(), {}),
        ("left padding", M.padding(real) & M.causal(), {}),
        ("strided 3 + global token 0", (M.causal() & M.strided(3)) | (M.global_tokens([0]) & M.causal()), {}),
        ("ALiBi + causal", M.causal(), {"bias": ak.positions.ALiBi(4)}),
        ("softcap 5 + causal", M.causal(), {"softcap": 5.0}),
        ("causal, weights returned", M.causal(), {"return_weights": True}),
    ]


def add_parser(sub) -> None:
    p = sub.add_parser("tour", aliases=["demo"],
                       help="a tour: attention with several masks and positions, and why each backend served it")
    p.add_argument("--length", type=int, default=12,
                   help=f"sequence length, {MIN_LENGTH} to {MAX_LENGTH} (the masks are drawn L x L; default 12)")
    p.set_defaults(run=run)


def run(args) -> int:
    if not MIN_LENGTH <= args.length <= MAX_LENGTH:
        from attnkit.errors import AttnkitValueError

        raise AttnkitValueError(f"--length must be a sequence length from {MIN_LENGTH} to {MAX_LENGTH} (each mask is "
                                f"drawn as an L x L picture), got {args.length}; e.g. --length 12.")
    L, g = args.length, torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, L, 32, generator=g)  # (B, H, L, D)
    k, v = torch.randn(2, 1, 2, L, 32, generator=g)  # (B, Hkv=2, L, D) each: grouped-query attention
    print(f"attnkit {ak.__version__} - q {tuple(q.shape)}, k/v {tuple(k.shape)} (GQA, 2 query heads per KV head)")
    print(f"backends available here: {ak.backends.available()}\n")
    for title, mask, kwargs in cases(L):
        result = ak.attention(q, k, v, mask, **kwargs)
        out = result[0] if isinstance(result, tuple) else result
        golden = ak.reference_attention(q.double(), k.double(), v.double(), mask,
                                        **{k_: v_ for k_, v_ in kwargs.items() if k_ != "return_weights"})
        why = ak.explain(q, k, v, mask, **kwargs)
        print(f"== {title}: {mask!r}")
        print(mask.picture(L, L))
        print(str(why))
        print(f"max |out - float64 reference| = {float((out.double() - golden).abs().max()):.2e}\n")

    print(f"== decoding one token after {L - 1} cached ones (bottom-right causal: the new query sees every key)")
    print(M.causal().picture(1, L))
    print(ak.explain(q[:, :, -1:], k, v, M.causal()), "\n")

    print("== MultiHeadAttention with RoPE and GQA on x (B=2, L, E=64)")
    mha = ak.nn.MultiHeadAttention(64, num_heads=4, num_kv_heads=2, positions="rope", init_std=0.02)
    x = torch.randn(2, L, 64, generator=g)
    y, w = mha(x, M.causal(), return_weights=True)
    print(mha)
    print(f"out {tuple(y.shape)}, weights {tuple(w.shape)}, rows sum to 1: {bool(torch.allclose(w.sum(-1), torch.ones(1)))}")
    return 0
