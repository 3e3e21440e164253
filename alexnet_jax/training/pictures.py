"""Pictures of a run, as PNG files in its workdir: its training curves, and conv1's filters a block per tower (the
paper's Figure 3) with a number per tower for how much colour its filters carry.

Filters are drawn as cuda-convnet's shownet and the paper drew them: each scaled on its own so that its largest
|weight| reaches black or full colour and a weight of 0 is mid-grey. One colour scale for all would show the few
filters with large weights and leave the rest flat grey, and a min-to-max stretch would move each filter's zero,
tinting a filter that has no colour at all.

Colour specialisation of a filter: the share of its energy that is colour rather than brightness, i.e. off the grey
axis, ‖w − mean_c(w)‖² / ‖w‖² over its pixels: 0 for a filter that treats R, G and B alike, 2/3 for one that sees a
single channel, up to 1 for an opponent-colour one such as red against green; random filters average 2/3. A tower's
figure is the mean over its filters: in the paper one tower learned grey edges, the other colour blobs.
"""

import json
import os

import numpy as np

from alexnet_jax.training import metrics, run

TOWER_NAMES = "abcdefgh"  # as the loop prints them and the PyTorch layout orders them
FILTER_PIXELS = 56  # a filter's side on screen, about: an 11×11 filter's weights as 5×5 squares
BACKGROUND = 255  # white between filters, apart from the mid-grey of a zero weight
TOWER_GAP, LABEL_PIXELS, CAPTION_PIXELS = 16, 110, 62  # between the towers' blocks; beside and above the image


def _pyplot():
  """matplotlib's pyplot drawing to files only, imported when a picture is drawn: every script that imports the
  training loop would otherwise pay its second of importing."""
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt  # noqa: PLC0415

  return plt


def colour_shares(filters: np.ndarray) -> np.ndarray:
  """filters (..., 3, KH, KW, F) → each filter's share of energy in colour rather than brightness, shape (..., F)."""
  w = np.asarray(filters, np.float64)
  chroma = w - w.mean(axis=-4, keepdims=True)
  return (chroma ** 2).sum(axis=(-4, -3, -2)) / np.maximum((w ** 2).sum(axis=(-4, -3, -2)), 1e-30)


def colour_specialisation(kernel: np.ndarray) -> np.ndarray:
  """kernel (towers, 3, KH, KW, F) → the mean colour share of each tower's filters, shape (towers,)."""
  return colour_shares(kernel).mean(axis=-1)


def filter_image(w: np.ndarray) -> np.ndarray:
  """One filter (3, KH, KW) → (KH, KW, 3) uint8 scaled to its own largest |weight|: 0 is mid-grey (128), ±max
  reach 255 and 0, so a filter reads the same whatever its norm."""
  w = np.asarray(w, np.float64).transpose(1, 2, 0)
  return np.round(127.5 + 127.5 * w / max(np.abs(w).max(), 1e-30)).astype(np.uint8)


def filter_grid(filters: np.ndarray, columns: int = 8, scale: int = 5, gap: int = 2) -> np.ndarray:
  """filters (3, KH, KW, F) → an RGB uint8 image of the F filters in rows of `columns`, each scaled to its own
  contrast (filter_image) and its weights drawn as scale×scale squares (no blur between them), `gap` background
  pixels apart."""
  _, kh, kw, f = filters.shape
  rows, h, w = -(-f // columns), kh * scale, kw * scale
  grid = np.full((rows * (h + gap) + gap, columns * (w + gap) + gap, 3), BACKGROUND, np.uint8)
  for i in range(f):
    r, c = divmod(i, columns)
    top, left = gap + r * (h + gap), gap + c * (w + gap)
    grid[top:top + h, left:left + w] = filter_image(filters[..., i]).repeat(scale, axis=0).repeat(scale, axis=1)
  return grid


def grey_first(filters: np.ndarray) -> np.ndarray:
  """filters (3, KH, KW, F) reordered from the greyest to the most coloured, so that a tower's leaning towards
  brightness or colour reads from its block at a glance, as it does in the paper's figure."""
  return filters[..., np.argsort(colour_shares(filters), kind="stable")]


def write_filters(kernel: np.ndarray, path: str, steps: int | None = None, change: bool = False) -> np.ndarray:
  """conv1's filters, a block per tower (tower a on top), each tower labelled with its colour specialisation;
  returns those figures. `change`: the kernel is what training added to the initial filters."""
  kernel = np.asarray(kernel)
  scores = colour_specialisation(kernel)
  towers, _, kh, kw, f = kernel.shape
  scale = max(1, round(FILTER_PIXELS / kh))
  grids = [filter_grid(grey_first(kernel[t]), min(f, 16), scale) for t in range(towers)]
  height, width = grids[0].shape[:2]
  gap = np.full((TOWER_GAP, width, 3), BACKGROUND, np.uint8)
  image = np.concatenate([part for grid in grids for part in (grid, gap)][:-1])
  plt = _pyplot()
  # The image at its own pixels (dpi 100) beside a margin for the labels: each weight stays a crisp square.
  fig = plt.figure(figsize=((width + LABEL_PIXELS) / 100, (image.shape[0] + CAPTION_PIXELS) / 100))
  ax = fig.add_axes((LABEL_PIXELS / (width + LABEL_PIXELS), 0, width / (width + LABEL_PIXELS),
                     image.shape[0] / (image.shape[0] + CAPTION_PIXELS)))
  ax.imshow(image, interpolation="nearest")
  ax.axis("off")
  for t in range(towers):
    ax.text(-8, t * (height + TOWER_GAP) + height / 2, f"tower {TOWER_NAMES[t]}\ncolour {scores[t]:.2f}",
            ha="right", va="center", fontsize=10)
  fig.text(0.01, 1 - 6 / (image.shape[0] + CAPTION_PIXELS),
           filters_caption(scores, f * towers, f"{kh}×{kw}", steps, change), ha="left", va="top", fontsize=9)
  fig.savefig(path, dpi=100, bbox_inches="tight", facecolor="white")
  plt.close(fig)
  return scores


def filters_caption(scores: np.ndarray, count: int, size: str, steps: int | None, change: bool = False) -> str:
  after = f" after {steps:,} steps" if steps is not None else ""
  if change:  # a short run's filters are mostly their random start: what it learned shows in the difference
    return (f"What training changed in conv1's {count} filters ({size} pixels, RGB){after}: each filter minus its "
            "random start, scaled to its own contrast (mid-grey = 0)\n"
            + filters_caption(scores, count, size, steps).split("\n", 1)[1])
  towers = len(scores)
  blocks = {1: "", 2: "top: tower a, bottom: tower b; "}.get(towers, f"towers a–{TOWER_NAMES[towers - 1]}, top down; ")
  colours = " vs ".join(f"{s:.2f}" for s in scores)
  return (f"conv1's {count} filters ({size} pixels, RGB){after}, each scaled to its own contrast (mid-grey = 0)\n"
          f"{blocks}within a tower, from grey to coloured.\nColour specialisation {colours}: how much of each tower's "
          "filters lies in colour rather than brightness (0: grey only; random filters ≈ 0.67).")


def run_title(workdir: str, rows: list[dict]) -> str:
  """The run's name (its workdir's), what it trained (from run.json, where it can be read) and its last held-out
  top-1: a picture that leaves the directory still says which run it is."""
  title = os.path.basename(os.path.abspath(workdir))
  try:
    with open(os.path.join(workdir, run.FILE)) as f:
      described = json.load(f)
    config = described["config"]
    title += f": {config['network']} (width {config['width']:g}) on {described['dataset']['name']}"
  except (OSError, ValueError, KeyError, TypeError):
    pass  # a run.json missing or foreign: the workdir's name still says which run it is
  evals = [r for r in rows if r["split"] == "eval" and r.get("top1") is not None]
  if evals:
    title += f", held-out top-1 {evals[-1]['top1']:.1%} at step {evals[-1]['step']:,}"
  return title


# (metric, y label, accuracy or not): training and held-out values share a panel, as they share a scale.
PANELS = (("loss", "loss (cross-entropy)", False), ("top1", "top-1 accuracy", True),
          ("top5", "top-5 accuracy", True), ("learning_rate", "learning rate", False))
SPLITS = (("train", "training batches", dict(linestyle="-", linewidth=1.2, marker="None")),
          ("eval", "held-out images", dict(linestyle=":", linewidth=0.8, marker="o", markersize=5)))


def curves_figure(rows: list[dict], title: str):
  """The matplotlib figure of curves.png: training values as lines (they are logged every few steps), held-out
  evaluations as points (a few per run, which a plain line would pass off as a curve)."""
  from matplotlib.ticker import PercentFormatter  # noqa: PLC0415

  plt = _pyplot()
  fig, axes = plt.subplots(1, len(PANELS), figsize=(16, 3.9))
  for ax, (name, label, accuracy) in zip(axes, PANELS):
    for split, legend, style in SPLITS:
      points = [(r["step"], r[name]) for r in rows if r["split"] == split and r.get(name) is not None]
      if points:
        ax.plot(*zip(*points), label=legend, **style)
    ax.set_xlabel("training step")
    ax.set_ylabel(label)
    if accuracy:
      ax.set_ylim(0, 1.02)
      ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    if name == "learning_rate" and any(r.get(name) for r in rows):
      ax.set_yscale("log")
    elif name != "learning_rate" and ax.lines:
      ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
  fig.suptitle(title, fontsize=11)
  fig.tight_layout()
  return fig


def write_curves(workdir: str, rows: list[dict], path: str) -> None:
  fig = curves_figure(rows, run_title(workdir, rows))
  fig.savefig(path, dpi=100, bbox_inches="tight")
  _pyplot().close(fig)


def write_all(workdir: str, conv1_kernel, step: int | None = None, initial=None) -> dict:
  """curves.png and conv1_filters.png in `workdir`, from its metrics.jsonl and `conv1_kernel` (towers, 3, KH, KW,
  F), the weights of `step`, and conv1_learned.png, what training added to `initial` (the same layer's weights at
  the start) where given; returns the towers' colour specialisation."""
  rows = metrics.read(os.path.join(workdir, metrics.JSONL))
  write_curves(workdir, rows, os.path.join(workdir, "curves.png"))
  scores = write_filters(conv1_kernel, os.path.join(workdir, "conv1_filters.png"), step)
  if initial is not None:
    change = np.asarray(conv1_kernel, np.float32) - np.asarray(initial, np.float32)
    write_filters(change, os.path.join(workdir, "conv1_learned.png"), step, change=True)
  return {f"colour_tower_{TOWER_NAMES[t]}": float(s) for t, s in enumerate(scores)}
