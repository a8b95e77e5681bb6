"""``attnkit bench cp``: context parallelism on 1, 2 and 4 processes of this machine (gloo).

For each world size, mask (causal, sliding window) and strategy (ring, all-gather; one process runs the
local path) the suite measures, per process, the attention layer's training step (forward + backward of
``q, k, v`` made inside the step, so their memory and their gradients count):

- the longest global sequence that fits a fixed memory budget per process: peak tensor memory is measured
  at two lengths, the line through them predicts the longest length, and a run at that length verifies it;
- time per step at that length (median over rounds, the slowest rank), and the work balance (max / mean
  score entries per rank: zigzag makes causal work equal);
- bytes sent per step, all ranks together, against the minimum the mask requires: every needed K/V shard
  once forward and its dK/dV once backward.

Spawned processes share the machine's cores, so a 4-process step runs 4 ranks on however many cores there
are: read the memory and byte columns as the result, and time only as a ratio on the same machine. The
single-process baseline is ``ak.attention`` (the fastest registered backend) at the same length.

``project()`` turns the measured message sizes and compute into step times for 8-64 GPUs under stated
bandwidth and throughput assumptions (docs/distributed.md).

Shape legend: B batch, H heads, Hkv KV heads, L global length, D head dim, W world size.
"""


from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

SUMMARY = "context parallelism on 1, 2, 4 processes: longest sequence at a memory budget, step time, bytes sent"

RESULT_NAME = "cp"


def _mask(kind: str, window: int):
    import attnkit as ak

    return ak.masks.causal() if kind == "causal" else ak.masks.sliding_window(window)


def _step(cfg: dict, L: int, strategy: str, rank: int, world: int):
    """One training step of the attention layer at global length L; returns the message log."""
    from attnkit import distributed as akd

    mask = _mask(cfg["mask"], cfg["window"])
    layout = akd.layout_for(mask, L, world)
    n = layout.length(rank)
    B, H, Hkv, D = cfg["batch"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"]
    q = torch.randn(B, H, n, D, requires_grad=True)
    k = torch.randn(B, Hkv, n, D, requires_grad=True)
    v = torch.randn(B, Hkv, n, D, requires_grad=True)
    with akd.count_messages() as log:
        if strategy == "baseline":
            import attnkit as ak

            out = ak.attention(q, k, v, mask)
        else:
            out = akd.context_parallel_attention(q, k, v, mask, layout=layout, tile=cfg["tile"],
                                                 strategy="auto" if strategy == "local" else strategy)
        out.backward(torch.ones_like(out))
    return log, layout, (q, k, v)


def _max_over_ranks(value: float, world: int) -> float:
    import torch.distributed as dist

    if world == 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t)


def _sum_over_ranks(value: float, world: int) -> float:
    import torch.distributed as dist

    if world == 1:
        return value
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t)


def _barrier(world: int) -> None:
    import torch.distributed as dist

    if world > 1:
        dist.barrier()


def _peak(cfg, L, strategy, rank, world) -> float:
    from attnkit.bench.common import peak_memory_bytes

    return _max_over_ranks(peak_memory_bytes(lambda: _step(cfg, L, strategy, rank, world)), world)


def _measure(cfg: dict, strategy: str, rank: int, world: int) -> dict:
    from attnkit import distributed as akd

    budget = cfg["budget_mib"] * 2**20
    quantum = 2 * world * 64
    lengths = [world * n for n in cfg["fit_lengths"]]
    peaks = [_peak(cfg, L, strategy, rank, world) for L in lengths]
    slope = (peaks[1] - peaks[0]) / (lengths[1] - lengths[0])  # bytes per global token
    longest = int((budget - peaks[0]) / slope + lengths[0]) // quantum * quantum
    longest = max(min(longest, cfg["max_len"] // quantum * quantum), quantum)
    peak = _peak(cfg, longest, strategy, rank, world)
    while peak > budget and longest > quantum:  # the line was optimistic: step down until it fits
        longest -= quantum
        peak = _peak(cfg, longest, strategy, rank, world)
    times = []
    for i in range(cfg["repeats"] + 1):
        _barrier(world)
        start = time.perf_counter()
        log, layout, (q, k, v) = _step(cfg, longest, strategy, rank, world)
        _barrier(world)
        if i:  # the first round warms up
            times.append(_max_over_ranks(time.perf_counter() - start, world))
    mask = _mask(cfg["mask"], cfg["window"])
    e = akd.explain(q.detach(), k.detach(), v.detach(), mask, layout=layout, tile=cfg["tile"],
                    strategy="auto" if strategy in ("local", "baseline") else strategy)
    work_max, work_sum = _max_over_ranks(e.work, world), _sum_over_ranks(e.work, world)
    sent = _sum_over_ranks(log.nbytes(), world)
    minimum = 2 * e.forward_bytes()["minimum"]  # K/V once forward, dK/dV (same size in float32) once backward
    return {"world": world, "mask": cfg["mask"], "strategy": strategy if strategy != "local" else "local",
            "chosen": e.strategy, "layout": e.layout, "longest_seq": longest, "peak_mib": peak / 2**20,
            "fit": {"lengths": lengths, "peak_mib": [p / 2**20 for p in peaks]},
            "step_s": statistics.median(times), "bytes_sent": int(sent), "bytes_minimum": int(minimum),
            "messages": int(_sum_over_ranks(log.count(), world)),
            "work_balance": work_max / (work_sum / world) if work_sum else 1.0,
            "score_entries": int(work_sum)}


def _worker(rank: int, world: int, init_file: str, out_dir: str, cfg: dict) -> None:
    import torch.distributed as dist

    torch.set_num_threads(cfg["threads"])
    torch.manual_seed(rank)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        rows = []
        for mask in cfg["masks"]:
            strategies = ["local", "baseline"] if world == 1 else ["ring", "all_gather"]
            for strategy in strategies:
                c = dict(cfg, mask=mask)
                if strategy == "baseline":  # ak.attention at the local path's longest length
                    L = next(r["longest_seq"] for r in rows if r["mask"] == mask and r["strategy"] == "local")
                    c = dict(c, fit_lengths=[L // 2, L], max_len=L)
                rows.append(_measure(c, strategy, rank, world))
                if rank == 0:
                    print(f"  W={world} {mask:>7} {strategy:>10}: L={rows[-1]['longest_seq']} "
                          f"step {rows[-1]['step_s']:.2f}s sent {rows[-1]['bytes_sent'] / 2**20:.1f} MiB "
                          f"(min {rows[-1]['bytes_minimum'] / 2**20:.1f})", flush=True)
        if rank == 0:
            torch.save(rows, os.path.join(out_dir, f"w{world}.pt"))
    finally:
        if world > 1:
            dist.destroy_process_group()


def measure(cfg: dict) -> list[dict]:
    """Spawn each world size in turn; returns one row per (world, mask, strategy)."""
    import torch.multiprocessing as mp

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for world in cfg["worlds"]:
            mp.start_processes(_worker, args=(world, os.path.join(tmp, f"init{world}"), tmp, cfg), nprocs=world,
                               start_method="spawn")
            rows += torch.load(os.path.join(tmp, f"w{world}.pt"), weights_only=False)
    return rows


# ------------------------------------------------------------------------------------------- projection

#: the assumptions of :func:`project` (stated in the results and in docs/distributed.md)
ASSUMED = {"gpu_tflops": 400.0, "nvlink_gbps": 400.0, "network_gbps": 50.0, "gpus_per_node": 8,
           "heads": 32, "kv_heads": 8, "head_dim": 128, "bytes_per_value": 2, "tokens_per_gpu": 16384,
           "window": 4096}


def project(worlds=(8, 16, 32, 64), assumed: dict = ASSUMED) -> list[dict]:
    """Step time of one attention layer (fwd + bwd) per strategy for W GPUs at ``tokens_per_gpu`` each.

    Compute: ``4 * entries * H * D`` FLOP forward and 2.5x that backward, ``entries`` the score entries a
    rank computes (causal zigzag ``L^2 / 2W``, sliding window ``L * window / W``: the tile counts this suite
    measures, in closed form). Traffic per rank: the K/V shards it receives (each ``L/W * 2 * Hkv * D``
    values) forward, and the dK/dV it returns backward (the ring also re-receives K/V). Bandwidth: NVLink
    inside a node, the network beyond ``gpus_per_node`` (the slowest link paces every ring step). The ring
    overlaps each step's transfer with the previous shard's compute; the all-gather waits for its shards.
    """
    a = assumed
    H, Hkv, D, nbytes = a["heads"], a["kv_heads"], a["head_dim"], a["bytes_per_value"]
    rows = []
    for W in worlds:
        L, n = a["tokens_per_gpu"] * W, a["tokens_per_gpu"]
        bw = (a["nvlink_gbps"] if a["gpus_per_node"] >= W else a["network_gbps"]) * 1e9
        shard = n * 2 * Hkv * D * nbytes  # bytes of one packed K/V shard
        for mask in ("causal", "window"):
            entries = L * L / (2 * W) if mask == "causal" else L * min(a["window"], L) / W
            needed = W - 1 if mask == "causal" else min(W - 1, -(-a["window"] // n))  # shards a rank receives
            flops = 4 * entries * H * D * 3.5
            t_comp = flops / (a["gpu_tflops"] * 1e12)
            ring_comm = needed * shard * 3 / bw  # K/V forward, K/V again + dK/dV backward
            gather_comm = needed * shard * 2 / bw  # K/V forward, dK/dV backward
            steps = needed + 1
            ring = steps * max(t_comp / steps, ring_comm / max(needed, 1)) if needed else t_comp
            gather = t_comp + gather_comm
            rows.append({"world": W, "mask": mask, "seq_len": L, "compute_s": t_comp,
                         "ring_comm_s": ring_comm, "all_gather_comm_s": gather_comm, "ring_step_s": ring,
                         "all_gather_step_s": gather, "ring_efficiency": t_comp / ring,
                         "all_gather_efficiency": t_comp / gather})
    return rows


def measured_tflops(row: dict, cfg: dict) -> float:
    """Achieved TFLOP/s of a measured row: ``4 * entries * H * D * 3.5`` FLOP (fwd + bwd) per step."""
    return 4 * row["score_entries"] * cfg["heads"] * cfg["head_dim"] * 3.5 / row["step_s"] / 1e12


# ------------------------------------------------------------------------------------------- CLI


def plot(payload: dict, path: Path) -> Path:
    from attnkit.bench.plots import line_panels

    panels = {"longest sequence at budget": {}, "time per step (s)": {}, "bytes sent / minimum": {}}
    for row in payload["rows"]:
        if row["strategy"] == "baseline":
            names = [f"{row['mask']} ak.attention (1 process)"]
        elif row["strategy"] == "local":  # one process starts both strategies' lines
            names = [f"{row['mask']} ring", f"{row['mask']} all_gather"]
        else:
            names = [f"{row['mask']} {row['strategy']}"]
        for name in names:
            panels["longest sequence at budget"].setdefault(name, []).append((row["world"], row["longest_seq"]))
            panels["time per step (s)"].setdefault(name, []).append((row["world"], row["step_s"]))
            if row["bytes_minimum"]:
                panels["bytes sent / minimum"].setdefault(name, []).append(
                    (row["world"], row["bytes_sent"] / row["bytes_minimum"]))
    return line_panels(panels, path, ylabel={"longest sequence at budget": "tokens", "time per step (s)": "s",
                                             "bytes sent / minimum": "ratio"},
                       xlabel="processes", log="none",
                       title=f"context parallel attention, {payload['config']['budget_mib']} MiB per process")


def replot(payload: dict, results: Path) -> list[Path]:
    """``attnkit bench plots``: this suite's figure redrawn next to ``results``."""
    return [plot(payload, results.with_suffix(".png"))]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--masks", nargs="+", default=["causal", "window"], choices=["causal", "window"])
    parser.add_argument("--budget-mib", type=float, default=8.0, help="memory budget per process")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--tile", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-len", type=int, default=32768, help="cap on the searched length")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--out", default=None, help="results folder (default benchmarks/results)")


def run(args: argparse.Namespace) -> int:
    from attnkit.bench.common import RESULTS_DIR, write_results

    cfg = {"worlds": args.worlds, "masks": args.masks, "budget_mib": args.budget_mib, "batch": 1,
           "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim, "window": args.window,
           "tile": args.tile, "repeats": args.repeats, "max_len": args.max_len, "threads": args.threads,
           "fit_lengths": [256, 768]}
    rows = measure(cfg)
    out_dir = Path(args.out) if args.out else RESULTS_DIR
    local = next((r for r in rows if r["strategy"] == "local" and r["mask"] == "causal"), None)
    projection = {"gpu": {"assumed": ASSUMED, "rows": project()}}
    if local is not None:  # this machine's measured kernel rate, one core per rank, over 10 Gb/s Ethernet
        tflops = measured_tflops(local, cfg)
        cpu = dict(ASSUMED, gpu_tflops=tflops, nvlink_gbps=1.25, network_gbps=1.25, gpus_per_node=1,
                   heads=cfg["heads"], kv_heads=cfg["kv_heads"], head_dim=cfg["head_dim"], bytes_per_value=4,
                   tokens_per_gpu=local["longest_seq"], window=cfg["window"])
        projection["cpu_measured"] = {"assumed": cpu, "rows": project(assumed=cpu)}
    payload = {"config": cfg, "rows": rows, "projection": projection,
               "note": "spawned gloo processes share this machine's cores: 4 processes on fewer cores "
                       "time-share them; memory and bytes are per step, time is the slowest rank's"}
    path = write_results(RESULT_NAME, payload, out_dir)
    plot(payload, path.with_suffix(".png"))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return 0
