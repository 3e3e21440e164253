"""Pictures of a run, as PNG files in its workdir: training curves, and conv1's filters one grid per tower (the
paper's Figure 3) with a number per tower for how much colour its filters carry.

Colour specialisation of a filter: the share of its energy that lies off the grey axis, ‖w − mean_c(w)‖² / ‖w‖²
over its pixels: 0 for a filter that treats R, G and B alike, 2/3 for one that sees a single channel, up to 1 for an
opponent-colour one such as red against green; random filters average 2/3. A tower's figure is the mean over its
filters: in the paper one tower learned grey edges, the other colour blobs.
"""

import os

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from alexnet_jax.training import metrics  # noqa: E402


def colour_specialisation(kernel: np.ndarray) -> np.ndarray:
  """kernel (towers, 3, KH, KW, F) → the mean chroma share of each tower's filters, shape (towers,)."""
  w = np.asarray(kernel, np.float64)
  chroma = w - w.mean(axis=1, keepdims=True)
  share = (chroma ** 2).sum(axis=(1, 2, 3)) / np.maximum((w ** 2).sum(axis=(1, 2, 3)), 1e-30)
  return share.mean(axis=-1)


def filter_grid(filters: np.ndarray, columns: int = 8, gap: int = 1) -> np.ndarray:
  """filters (3, KH, KW, F) → an RGB uint8 image of the F filters, each contrast-stretched on its own."""
  _, kh, kw, f = filters.shape
  rows = -(-f // columns)
  grid = np.full((rows * (kh + gap) + gap, columns * (kw + gap) + gap, 3), 255, np.uint8)
  for i in range(f):
    w = np.asarray(filters[..., i], np.float64).transpose(1, 2, 0)
    w = (w - w.min()) / max(w.max() - w.min(), 1e-12)
    r, c = divmod(i, columns)
    grid[gap + r * (kh + gap):gap + r * (kh + gap) + kh, gap + c * (kw + gap):gap + c * (kw + gap) + kw] = w * 255
  return grid


def write_filters(kernel: np.ndarray, path: str) -> np.ndarray:
  """conv1's filters, one grid per tower, titled with each tower's colour specialisation; returns those figures."""
  kernel = np.asarray(kernel)
  scores = colour_specialisation(kernel)
  fig, axes = plt.subplots(1, len(kernel), figsize=(4 * len(kernel), 4), squeeze=False)
  for t, ax in enumerate(axes[0]):
    ax.imshow(filter_grid(kernel[t]), interpolation="nearest")
    ax.set_title(f"tower {'abcdefgh'[t]}: colour {scores[t]:.3f}")
    ax.axis("off")
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)
  return scores


def write_curves(metrics_jsonl: str, path: str) -> None:
  """Loss, top-1 and top-5 against steps, train and eval, from a run's metrics.jsonl."""
  rows = metrics.read(metrics_jsonl)
  fig, axes = plt.subplots(1, 3, figsize=(13, 3.5))
  for ax, name in zip(axes, ("loss", "top1", "top5")):
    for split, style in (("train", "-"), ("eval", "o-")):
      points = [(r["step"], r[name]) for r in rows if r["split"] == split and name in r]
      if points:
        ax.plot(*zip(*points), style, label=split, markersize=3)
    ax.set_xlabel("step")
    ax.set_title(name)
    ax.legend()
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def write_all(workdir: str, conv1_kernel) -> dict:
  """curves.png and conv1_filters.png in `workdir`; returns the towers' colour specialisation."""
  write_curves(os.path.join(workdir, "metrics.jsonl"), os.path.join(workdir, "curves.png"))
  scores = write_filters(conv1_kernel, os.path.join(workdir, "conv1_filters.png"))
  return {f"colour_tower_{'abcdefgh'[t]}": float(s) for t, s in enumerate(scores)}
