"""Heat-map rendering of an attention map (matplotlib, Agg backend), written atomically."""

from __future__ import annotations

from pathlib import Path

from ..io import atomic_write, image_format
from .attention_maps import AttentionMap


def save_heatmap(m: AttentionMap, path: str | Path, name: str) -> Path:
    fmt = image_format(path)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n_out, n_in = m.weights.shape
    fig = Figure(figsize=(min(2.5 + 0.32 * n_in, 24), min(2.0 + 0.32 * n_out, 24)), dpi=110)
    FigureCanvasAgg(fig)  # the Agg canvas, without pyplot's global state
    ax = fig.subplots()
    image = ax.imshow(m.weights.numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(n_in), m.cols, fontsize=8)
    ax.set_yticks(range(n_out), m.rows, fontsize=8)
    ax.set_xlabel("input tokens")
    ax.set_ylabel("output tokens")
    ax.xaxis.set_ticks_position("top")
    ax.xaxis.set_label_position("top")
    ax.set_title(f"{name}: {m.title}", fontsize=9, pad=24)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="attention weight")
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt))
