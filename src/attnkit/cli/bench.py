"""``attnkit bench <suite>``: benchmark suites from ``attnkit.bench.<suite>``.

Each suite module exposes ``add_arguments(parser)`` and ``run(args) -> int``; suites whose module is not
present are not listed.
"""

from __future__ import annotations

import importlib
import importlib.util

SUITES = {
    "attention": "attention speed and memory for every mask kind vs SDPA, naive, nn.MultiheadAttention, flex",
    "decode": "tokens/s of cached decoding vs Hugging Face transformers and no cache",
    "train": "tokens/s of a training step vs a plain reference GPT",
    "linear": "linear attention vs softmax attention: time, memory, crossover, decode cost",
    "cp": "context parallelism on 1, 2, 4 processes: longest sequence at a memory budget, step time, bytes sent",
    "hf": "Hugging Face models with attn_implementation='attnkit' vs 'sdpa' (sliding window at 4096; MiniLM)",
    "report": "size and time to interactive of the HTML report in headless Chromium (12 layers x 12 heads)",
    "doctor": "end-to-end time of attnkit doctor (tiny, MiniLM, a 12-layer GPT-2), its report and train --overfit",
    "plots": "redraw the plots of recorded results (benchmarks/results/*.json) without re-running",
}


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run a benchmark suite and record results under benchmarks/results/")
    suites = p.add_subparsers(dest="suite", required=True)
    for name, help_text in SUITES.items():
        if importlib.util.find_spec(f"attnkit.bench.{name}") is None:
            continue
        module = importlib.import_module(f"attnkit.bench.{name}")
        sp = suites.add_parser(name, help=help_text)
        module.add_arguments(sp)
        sp.set_defaults(run=module.run)
