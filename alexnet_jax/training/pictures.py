"""Pictures of a run, as PNG files in its workdir: training curves, and conv1's filters one grid per tower (the
paper's Figure 3) with a number per tower for how much colour its filters carry.

Colour specialisation of a filter: the share of its energy that lies off the grey axis, ‖w − mean_c(w)‖² / ‖w‖²
over its pixels: 0 for a filter that treats R, G and B alike, 2/3 for one that sees a single channel, up to 1 for an
opponent-colour one such as red against green; random filters average 2/3. A tower's figure is the mean over its
filters: in the paper one tower learned grey edges, the other colour blobs.
"""

import os

import numpy as np

from alexnet_jax.training import metrics


def _pyplot():
  """matplotlib's pyplot drawing to files only, imported when a picture is drawn: every script that imports the
  training loop would otherwise pay its second of importing."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt  # noqa: PLC0415

  return plt


def colour_specialisation(kernel: np.ndarray) -> np.ndarray:
  """kernel (towers, 3, KH, KW, F) → the mean chroma share of each tower's filters, shape (towers,)."""
  w = np.asarray(kernel, np.float64)
  chroma = w - w.mean(axis=1, keepdims=True)
  share = (chroma ** 2).sum(axis=(1, 2, 3)) / np.maximum((w ** 2).sum(axis=(1, 2, 3)), 1e-30)
  return share.mean(axis=-1)


def filter_grid(filters: np.ndarray, columns: int = 8, scale: int = 8, gap: int = 4) -> np.ndarray:
  """filters (3, KH, KW, F) → an RGB uint8 image of the F filters, each contrast-stretched on its own (its
  smallest weight black, its largest white, as the paper's Figure 3 shows them) and enlarged `scale` times."""
  _, kh, kw, f = filters.shape
  rows, h, w = -(-f // columns), kh * scale, kw * scale
  grid = np.full((rows * (h + gap) + gap, columns * (w + gap) + gap, 3), 255, np.uint8)
  for i in range(f):
    x = np.asarray(filters[..., i], np.float64).transpose(1, 2, 0)
    x = (x - x.min()) / max(x.max() - x.min(), 1e-12)
    x = np.kron(x, np.ones((scale, scale, 1)))  # each weight a scale×scale square: no blur between them
    r, c = divmod(i, columns)
    grid[gap + r * (h + gap):gap + r * (h + gap) + h, gap + c * (w + gap):gap + c * (w + gap) + w] = x * 255
  return grid


def write_filters(kernel: np.ndarray, path: str) -> np.ndarray:
  """conv1's filters, the towers side by side as in the paper's Figure 3, each titled with its colour
  specialisation; returns those figures."""
  kernel = np.asarray(kernel)
  scores = colour_specialisation(kernel)
  towers, _, kh, kw, f = kernel.shape
  columns = min(8, f)
  grids = [filter_grid(kernel[t], columns) for t in range(towers)]
  height, width = grids[0].shape[:2]
  plt = _pyplot()
  fig, axes = plt.subplots(1, towers, figsize=(towers * width / 100 + 0.5, height / 100 + 0.8), squeeze=False)
  for t, ax in enumerate(axes[0]):
    ax.imshow(grids[t], interpolation="nearest")
    ax.set_title(f"tower {'abcdefgh'[t]}: colour {scores[t]:.2f}", fontsize=12)
    ax.axis("off")
  fig.suptitle(f"conv1: {f} filters of {kh}×{kw}×3 per tower, each stretched to its own range. Colour: the share "
               "of a filter's energy off the grey axis\n(0 grey, 2/3 random or one channel, 1 opponent colours), "
               "the tower's mean; in the paper one tower learned grey edges, the other colour blobs", fontsize=9)
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)
  return scores


PANELS = (("loss", "cross-entropy loss"), ("top1", "top-1 accuracy"), ("top5", "top-5 accuracy"),
          ("learning_rate", "learning rate"))


def write_curves(metrics_jsonl: str, path: str) -> None:
  """Loss, top-1 and top-5 accuracy (train and eval) and the learning rate against steps, from a run's
  metrics.jsonl."""
  rows = metrics.read(metrics_jsonl)
  plt = _pyplot()
  fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 3.6))
  for ax, (name, label) in zip(axes, PANELS):
    for split, style in (("train", ".-"), ("eval", "o-")):
      points = [(r["step"], r[name]) for r in rows if r["split"] == split and r.get(name) is not None]
      if points:
        ax.plot(*zip(*points), style, label=split, markersize=3)
    ax.set_xlabel("training step")
    ax.set_ylabel(label)
    if name == "learning_rate" and any(r.get(name) for r in rows):
      ax.set_yscale("log")
    elif name != "learning_rate":
      ax.legend()
    ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=100, bbox_inches="tight")
  plt.close(fig)


def write_all(workdir: str, conv1_kernel) -> dict:
  """curves.png and conv1_filters.png in `workdir`; returns the towers' colour specialisation."""
  write_curves(os.path.join(workdir, "metrics.jsonl"), os.path.join(workdir, "curves.png"))
  scores = write_filters(conv1_kernel, os.path.join(workdir, "conv1_filters.png"))
  return {f"colour_tower_{'abcdefgh'[t]}": float(s) for t, s in enumerate(scores)}
