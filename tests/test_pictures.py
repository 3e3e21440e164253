"""The pictures a run leaves: the colour measure of conv1's filters and the PNG files."""

import numpy as np
from PIL import Image

from alexnet_jax.training import pictures


def test_colour_specialisation_tells_grey_from_colour_towers():
  rng = np.random.default_rng(0)
  grey = np.repeat(rng.normal(size=(1, 1, 11, 11, 16)), 3, axis=1)  # R = G = B: luminance only
  red = np.zeros((1, 3, 11, 11, 16))
  red[:, 0] = rng.normal(size=(11, 11, 16))  # one channel only
  noise = rng.normal(size=(1, 3, 11, 11, 16))
  scores = pictures.colour_specialisation(np.concatenate([grey, red, noise]))
  np.testing.assert_allclose(scores[:2], [0.0, 2 / 3], atol=1e-12)
  assert abs(scores[2] - 2 / 3) < 0.03  # random filters: two of three directions are off the grey axis


def test_filter_grid_and_files(tmp_path):
  filters = np.random.default_rng(1).normal(size=(2, 3, 11, 11, 12))
  grid = pictures.filter_grid(filters[0], columns=8, scale=8, gap=4)
  assert grid.shape == (4 + 2 * (11 * 8 + 4), 4 + 8 * (11 * 8 + 4), 3) and grid.dtype == np.uint8
  weight = grid[4:12, 4:12]  # filter 0's first weight: an 8×8 square of one colour, not blurred into its neighbours
  assert (weight == weight[0, 0]).all() and (grid[:4] == 255).all()
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 10, "split": "train", "loss": 2.0, "top1": 0.1, "top5": 0.5}\n'
      '{"step": 10, "split": "eval", "loss": 1.9, "top1": 0.2, "top5": 0.6}\n')
  scores = pictures.write_all(str(tmp_path), filters)
  assert set(scores) == {"colour_tower_a", "colour_tower_b"}
  for name in ("curves.png", "conv1_filters.png"):
    assert Image.open(tmp_path / name).size[0] > 100
