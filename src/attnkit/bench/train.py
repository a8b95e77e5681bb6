"""``attnkit bench train``: tokens/s of a training step (forward, loss, backward, AdamW step) of the ``small``
preset against a minimal reference GPT written plainly below with PyTorch SDPA, same shapes, same run.

Contenders run side by side (``bench.common.round_robin``: random order each round, medians):

- ``reference fp32`` / ``reference bf16``: the plain GPT, fp32 and under bf16 autocast;
- ``attnkit fp32`` / ``attnkit bf16``: ``TransformerLM`` on the same batch, unpacked (plain causal rows);
- ``attnkit default``: the precision ``attnkit train`` picks on this machine (measured), unpacked;
- ``attnkit packed``: the default precision with packing on: document mask + positions restarting per document
  (the first 400 source files are mostly longer than a row, so at 8 x 512 most rows hold one document: the
  packed path must cost nothing over plain causal rows there);
- ``attnkit checkpointing``: the default precision with gradient checkpointing per block;
- ``long packed`` / ``long unpacked`` (``--long-seq-len``, default 4096, batch 1): rows packed from short
  documents (the source files under ``--long-max-doc`` bytes, several per row), with and without the document
  mask: where each packed row's attention work is a fraction of the unpacked one's.

Targets: attnkit fp32 / bf16 >= 1.0x the reference at the same precision; packed rows >= 1.0x unpacked at
``--seq-len``, and clearly faster at the long length. Peak memory (tensor allocations, profiler) is reported
for the precision and checkpointing trade-offs.

Shape legend: B batch rows, L sequence length, E dim, H heads, D head dim, V vocab.
"""


from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

from attnkit._timing import round_robin
from attnkit.bench.common import peak_memory_bytes, write_results
from attnkit.models.builders import lm_config
from attnkit.models.lm import TransformerLM
from attnkit.training.data import PackedDataset, load_documents
from attnkit.training.precision import autocast, choose_precision
from attnkit.training.steps import lm_loss, param_groups

SUMMARY = "tokens/s of a training step vs a plain reference GPT"

# ------------------------------------------------------------------------------------ the plain reference GPT


class RefBlock(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim, bias=False), nn.LayerNorm(dim, bias=False)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.fc, self.out = nn.Linear(dim, 4 * dim, bias=False), nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x, cos, sin):
        B, L, E = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(E, dim=-1)
        q, k, v = (t.view(B, L, self.heads, E // self.heads).transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, L, D)
        x = x + self.proj(y.transpose(1, 2).reshape(B, L, E))  # (B, L, E)
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


def rotate(x, cos, sin):
    """RoPE, half-split pairing: x (B, H, L, D), cos/sin (L, D/2)."""
    x1, x2 = x.float().chunk(2, dim=-1)  # (B, H, L, D/2) each
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


class RefGPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, max_len: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(RefBlock(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim, bias=False)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.embed.weight
        D = dim // heads
        angles = torch.arange(max_len)[:, None] * 10000.0 ** (-torch.arange(0, D, 2) / D)  # (L, D/2)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)

    def forward(self, tokens):
        L = tokens.shape[1]
        x = self.embed(tokens)  # (B, L, E)
        for block in self.blocks:
            x = block(x, self.cos[:L], self.sin[:L])
        return self.head(self.ln(x))  # (B, L, V)


# ------------------------------------------------------------------------------------ the benchmark


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="small")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurements")
    p.add_argument("--long-seq-len", type=int, default=4096, help="length of the packed-vs-unpacked long rows (0: skip)")
    p.add_argument("--long-max-doc", type=int, default=2048, help="documents (bytes) short enough for the long rows")
    p.add_argument("--out", default="benchmarks/results")


def _step_fn(model, loss_fn, precision, device):
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-4, foreach=True)

    def step():
        with autocast(precision, device):
            loss = loss_fn(model)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _ak_model(config, checkpointing: bool = False) -> TransformerLM:
    torch.manual_seed(0)
    m = TransformerLM(config)
    m.gradient_checkpointing = checkpointing
    return m.train()


def _ref_model(config, seq_len: int) -> RefGPT:
    torch.manual_seed(0)
    return RefGPT(config.vocab_size, config.embed_dim, config.num_layers, config.num_heads, seq_len).train()


def _ref_loss(batch):
    """The reference's loss on ``batch`` (it takes no positions or documents)."""
    return lambda model: F.cross_entropy(model(batch.inputs).float().flatten(0, 1), batch.targets.flatten())


def _ak_loss(batch):
    """attnkit's loss on ``batch``, with its positions and document ids (packed rows: no cross-document attention)."""
    return lambda model: F.cross_entropy(
        model(batch.inputs, positions=batch.positions, doc_ids=batch.doc_ids).float().flatten(0, 1),
        batch.targets.flatten())


def _long_contenders(args, config, default: str) -> tuple[dict, int]:
    """The packed-vs-unpacked steps on one long row of short documents, and how many documents the row holds."""
    long_config = config.replace(max_seq_len=args.long_seq_len)
    short_docs = [d for d in load_documents(None) if len(d[1]) < args.long_max_doc]
    long_packed = PackedDataset(short_docs, args.long_seq_len).batch(0, 1, seed=0)
    long_plain = PackedDataset(short_docs, args.long_seq_len, doc_mask=False).batch(0, 1, seed=0)
    long_docs = int((long_packed.positions == 0).sum())
    fns = {"long packed": _step_fn(_ak_model(long_config), _ak_loss(long_packed), default, torch.device("cpu")),
           "long unpacked": _step_fn(_ak_model(long_config), _ak_loss(long_plain), default, torch.device("cpu"))}
    print(f"long rows: 1 x {args.long_seq_len}, the packed row holds {long_docs} documents (of "
          f"{len(short_docs)} under {args.long_max_doc} bytes)")
    return fns, long_docs


def _ratios(results: dict, long_seq_len: int) -> dict:
    def ratio(a, b):
        return results[a]["tokens_per_s"] / results[b]["tokens_per_s"] if a in results and b in results else None

    return {
        "attnkit default / reference fp32": ratio("attnkit default", "reference fp32"),
        "attnkit fp32 / reference fp32 (target >= 1)": ratio("attnkit fp32", "reference fp32"),
        "attnkit bf16 / reference bf16 (target >= 1)": ratio("attnkit bf16", "reference bf16"),
        "attnkit packed / attnkit default unpacked (target >= 1)": ratio("attnkit packed", "attnkit default"),
        "attnkit checkpointing / attnkit default (speed)": ratio("attnkit checkpointing", "attnkit default"),
        f"long packed / long unpacked at {long_seq_len} (target > 1)": ratio("long packed", "long unpacked"),
    }


def _print_table(results: dict, ratios: dict) -> None:
    print(f"\n{'contender':26s} {'ms/step':>9s} {'tokens/s':>10s} {'peak MiB':>9s}")
    for name, r in results.items():
        mem = f"{r['peak_bytes'] / 2**20:9.0f}" if "peak_bytes" in r else f"{'':9s}"
        print(f"{name:26s} {r['seconds'] * 1e3:9.1f} {r['tokens_per_s']:10.0f} {mem}")
    print()
    for name, value in ratios.items():
        print(f"{name}: {'n/a' if value is None else f'{value:.2f}x'}")


def run(args) -> int:
    device = torch.device("cpu")
    config = lm_config(args.preset, max_seq_len=args.seq_len)
    docs = load_documents(None)[:400]
    packed = PackedDataset(docs, args.seq_len).batch(0, args.batch_size, seed=0)
    plain = PackedDataset(docs, args.seq_len, doc_mask=False).batch(0, args.batch_size, seed=0)
    n_docs = int((packed.positions == 0).sum())
    tokens = args.batch_size * args.seq_len
    probe = _ak_model(config)
    default, evidence = choose_precision(lambda p: lm_loss(probe, plain, p, device).backward(), device)
    measured = evidence.get("median_s", {})  # {"fp32": s, "bf16": s} when bf16 runs here, else {}
    fns = {"reference fp32": _step_fn(_ref_model(config, args.seq_len), _ref_loss(plain), "fp32", device),
           "attnkit fp32": _step_fn(_ak_model(config), _ak_loss(plain), "fp32", device)}
    if "bf16" in measured:
        fns["reference bf16"] = _step_fn(_ref_model(config, args.seq_len), _ref_loss(plain), "bf16", device)
        fns["attnkit bf16"] = _step_fn(_ak_model(config), _ak_loss(plain), "bf16", device)
    fns["attnkit packed"] = _step_fn(_ak_model(config), _ak_loss(packed), default, device)
    fns["attnkit checkpointing"] = _step_fn(_ak_model(config, True), _ak_loss(plain), default, device)
    print(f"{args.preset}: {_ak_model(config).num_parameters() / 1e6:.1f} M parameters, batch {args.batch_size} x "
          f"{args.seq_len}, packed rows hold {n_docs} documents ({n_docs / args.batch_size:.1f} per row); default "
          f"precision here: {default} ({evidence['summary']})")
    long_docs = None
    if args.long_seq_len:
        long_fns, long_docs = _long_contenders(args, config, default)
        fns.update(long_fns)
    times = round_robin(fns, args.repeats, warmup=1, device=device)
    times["attnkit default"] = times[f"attnkit {default}"]
    results = {name: {"seconds": t, "tokens_per_s": (args.long_seq_len if name.startswith("long") else tokens) / t}
               for name, t in times.items()}
    if not args.no_memory:
        for name in ("reference fp32", "attnkit fp32", "reference bf16", "attnkit bf16", "attnkit checkpointing"):
            if name in fns:
                results[name]["peak_bytes"] = peak_memory_bytes(fns[name])
    ratios = _ratios(results, args.long_seq_len)
    _print_table(results, ratios)
    path = write_results("train", {
        "preset": args.preset, "batch_size": args.batch_size, "seq_len": args.seq_len, "repeats": args.repeats,
        "default_precision": default, "precision_probe_seconds": measured, "precision_evidence": evidence,
        "results": results, "ratios": ratios,
        "packed_documents": n_docs, "long": {"seq_len": args.long_seq_len, "batch_size": 1,
                                             "max_doc_bytes": args.long_max_doc, "packed_documents": long_docs},
        "note": "medians of round-robin rounds on a shared machine (other engineers' jobs ran at the same time); "
                "read the ratios. Peak memory = tensor allocations recorded by the profiler during one step.",
    }, args.out)
    _plot(results, path.with_suffix(".png"))
    print(f"\nresults: {path} and {path.with_suffix('.png')}")
    return 0


def _plot(results: dict, out) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(names, [results[n]["tokens_per_s"] for n in names], color=["#888" if "reference" in n else "#2a7"
                                                                       for n in names])
    ax.set_xlabel("training tokens/s (higher is better)")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
