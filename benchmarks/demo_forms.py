"""``make demo``'s model in its two forms, trained side by side in one process: attnkit's original parts
(LayerNorm, tanh-GELU MLP of 4 x E, RoPE) against LLaMA's exact form (RMSNorm, SwiGLU of F = 344 ~ 8/3 x E,
RoPE; what the ``tiny`` preset is now, so that ``attnkit export runs/demo --hf out`` works).

Both models train on the same batches of ``make demo``'s data (the stdlib sources, packed rows of 256 bytes with
the document mask, batch 16, AdamW at the trainer's defaults: lr 2e-3 with 50 warmup steps and cosine decay to a
tenth, weight decay 0.1, clip 1.0, fp32), one optimizer step of each in turn (the order drawn per step), so that
the load of other jobs falls on both alike: the step-time ratio is a median of paired steps, and the validation
losses compare the forms at equal steps and at equal training time (a 3-minute demo trains for a time budget).

    OMP_NUM_THREADS=2 flock /tmp/attnkit-heavy.lock .venv/bin/python benchmarks/demo_forms.py [--steps 120]
    # writes benchmarks/results/demo_forms.json (--name: another file)
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from attnkit.bench.common import write_results  # noqa: E402
from attnkit.models.builders import build_lm  # noqa: E402
from attnkit.training.data import PackedDataset, load_documents, split_by_file  # noqa: E402

#: model fields over the ``tiny`` preset, both given in full (the script measures the same pair whatever it is)
FORMS = {"original": {"norm": "layernorm", "mlp": "gelu", "mlp_hidden": 512},
         "llama": {"norm": "rmsnorm", "mlp": "swiglu", "mlp_hidden": 344}}
SEQ_LEN, BATCH, LR, WARMUP, DECAY, CLIP = 256, 16, 2e-3, 50, 0.1, 1.0


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    progress = (step - WARMUP) / max(1, steps - WARMUP)
    return LR * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def loss_of(model, batch) -> torch.Tensor:
    logits = model(batch.inputs, positions=batch.positions, doc_ids=batch.doc_ids)  # (B, L, V)
    return F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten())


def val_loss(model, val) -> float:
    model.eval()
    with torch.no_grad():
        losses = [loss_of(model, b).item() for b in val.eval_batches(BATCH, 8)]
    model.train()
    return sum(losses) / len(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--eval-every", type=int, default=40)
    parser.add_argument("--name", default="demo_forms", help="results/NAME.json")
    args = parser.parse_args()
    before = os.getloadavg()[0]
    train_docs, val_docs = split_by_file(load_documents(None), 0.05)
    data, val = PackedDataset(train_docs, SEQ_LEN), PackedDataset(val_docs, SEQ_LEN)
    models, optims = {}, {}
    for name, fields in FORMS.items():
        torch.manual_seed(0)
        models[name] = build_lm("tiny", **fields).train()
        optims[name] = torch.optim.AdamW(models[name].parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=DECAY)
    times = {name: [] for name in FORMS}
    curve = {name: [] for name in FORMS}
    order, rng = list(FORMS), random.Random(0)
    for step in range(args.steps):
        batch = data.batch(step, BATCH, seed=0)
        rng.shuffle(order)
        for name in order:
            model, opt = models[name], optims[name]
            for group in opt.param_groups:
                group["lr"] = lr_at(step, args.steps)
            start = time.perf_counter()
            loss = loss_of(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
            times[name].append(time.perf_counter() - start)
        if (step + 1) % args.eval_every == 0 or step + 1 == args.steps:
            for name in FORMS:
                curve[name].append({"step": step + 1, "val_loss": val_loss(models[name], val),
                                    "train_seconds": sum(times[name])})
            print({name: curve[name][-1] for name in FORMS}, flush=True)
    forms = {name: {"model": FORMS[name], "parameters": models[name].num_parameters(),
                    "median_step_s": statistics.median(times[name]), "curve": curve[name]} for name in FORMS}
    old, new = forms["original"], forms["llama"]
    payload = {"steps": args.steps, "seq_len": SEQ_LEN, "batch_size": BATCH, "threads": torch.get_num_threads(),
               "load_1min_start": before, "load_1min_end": os.getloadavg()[0], "forms": forms,
               "step_time_ratio_llama_over_original": new["median_step_s"] / old["median_step_s"],
               "val_loss_llama_minus_original_at_equal_steps": new["curve"][-1]["val_loss"] -
               old["curve"][-1]["val_loss"]}
    print(f"wrote {write_results(args.name, payload)}")


if __name__ == "__main__":
    main()
