"""Attention heatmaps: one PNG per captured layer, one panel per head (rows = queries, columns = keys).

>>> with capture(model, rows=None) as cap:
...     model(tokens)
>>> paths = save_heatmaps(cap, "out/attn")          # out/attn_blocks.0.attn.png, ...

Shape legend: B batch, h captured heads, r captured rows, Lk keys.
"""

from __future__ import annotations

from pathlib import Path

from attnkit.errors import AttnkitValueError


def save_heatmaps(cap, prefix: str | Path, *, batch_index: int = 0, max_heads: int = 16) -> list[Path]:
    """Write the last record of each layer of ``cap`` (a :class:`capture`) as ``{prefix}_{layer}.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layers = cap.by_layer()
    if not layers:
        raise AttnkitValueError("the capture holds no records; run the model inside `with capture(model) as cap:` "
                                "before saving heatmaps.")
    prefix = Path(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer, records in layers.items():
        record = records[-1]
        weights = record.weights[batch_index].float().cpu()  # (h, r, Lk)
        heads = record.heads[:max_heads]
        fig, axes = plt.subplots(1, len(heads), figsize=(2.4 * len(heads), 2.6), squeeze=False)
        for ax, i, head in zip(axes[0], range(len(heads)), heads):
            ax.imshow(weights[i].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_title(f"head {head}", fontsize=9)
            ax.set_xlabel("key", fontsize=8)
            ax.set_ylabel("query", fontsize=8)
        fig.suptitle(layer or "<module>", fontsize=10)
        fig.tight_layout()
        path = prefix.with_name(f"{prefix.name}_{layer or 'module'}.png")
        fig.savefig(path, dpi=80)
        plt.close(fig)
        paths.append(path)
    return paths
