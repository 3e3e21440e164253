"""The pictures a run leaves: the colour measure of conv1's filters, how each filter is drawn, and the PNG files."""

import json

import jax
import numpy as np
from PIL import Image

from alexnet_jax.config import paper_config
from alexnet_jax.training import pictures, train


def test_colour_specialisation_tells_grey_from_colour_towers():
  rng = np.random.default_rng(0)
  grey = np.repeat(rng.normal(size=(1, 1, 11, 11, 16)), 3, axis=1)  # R = G = B: luminance only
  red = np.zeros((1, 3, 11, 11, 16))
  red[:, 0] = rng.normal(size=(11, 11, 16))  # one channel only
  noise = rng.normal(size=(1, 3, 11, 11, 16))
  scores = pictures.colour_specialisation(np.concatenate([grey, red, noise]))
  np.testing.assert_allclose(scores[:2], [0.0, 2 / 3], atol=1e-12)
  assert abs(scores[2] - 2 / 3) < 0.03  # random filters: two of three directions are off the grey axis


def test_each_filter_is_scaled_to_its_own_largest_weight_around_grey():
  w = np.random.default_rng(2).normal(size=(3, 5, 5))
  w[1, 2, 3] = 2 * np.abs(w).max()  # the largest |weight| is positive: full green
  image = pictures.filter_image(w)
  assert image.dtype == np.uint8 and image.shape == (5, 5, 3)
  assert image[2, 3, 1] == 255 and image.max() == 255 and image.min() > 0  # nothing else reaches either end
  np.testing.assert_array_equal(pictures.filter_image(-w)[2, 3, 1], 0)  # its negative: the other end
  np.testing.assert_array_equal(pictures.filter_image(np.zeros((3, 5, 5))), 128)  # a zero weight is mid-grey
  half = np.zeros((3, 5, 5))
  half[:, 0, 0], half[:, 4, 4] = 1.0, 0.5
  assert pictures.filter_image(half)[4, 4].tolist() == [191] * 3  # halfway between grey and white, in every channel


def test_a_filter_reads_the_same_whatever_its_scale_and_beside_larger_ones():
  filters = np.random.default_rng(3).normal(size=(3, 7, 7, 4))
  louder = filters * np.array([1.0, 1000.0, 1e-3, 1.0])
  np.testing.assert_array_equal(pictures.filter_grid(louder, columns=2), pictures.filter_grid(filters, columns=2))


def test_filter_grid_layout_keeps_weights_square_and_gaps_blank():
  filters = np.random.default_rng(1).normal(size=(3, 11, 11, 12))
  grid = pictures.filter_grid(filters, columns=8, scale=5, gap=2)
  assert grid.shape == (2 + 2 * (11 * 5 + 2), 2 + 8 * (11 * 5 + 2), 3) and grid.dtype == np.uint8
  weight = grid[2:7, 2:7]  # filter 0's first weight: a 5×5 square of one colour, not blurred into its neighbours
  assert (weight == weight[0, 0]).all() and (grid[:2] == 255).all() and (grid[:, 57:59] == 255).all()
  np.testing.assert_array_equal(grid[2:57, 59:114], pictures.filter_image(filters[..., 1]).repeat(5, 0).repeat(5, 1))


def test_filters_go_from_grey_to_coloured_within_a_tower():
  rng = np.random.default_rng(4)
  grey = np.repeat(rng.normal(size=(1, 6, 6, 1)), 3, axis=0)
  red = np.zeros((3, 6, 6, 1))
  red[0] = rng.normal(size=(6, 6, 1))
  mixed = grey + 0.5 * red
  ordered = pictures.grey_first(np.concatenate([red, grey, mixed], axis=-1))
  np.testing.assert_array_equal(ordered, np.concatenate([grey, mixed, red], axis=-1))


def test_curves_name_the_run_and_draw_evaluations_as_points(tmp_path):
  workdir = tmp_path / "my_run"
  workdir.mkdir()
  (workdir / "run.json").write_text(json.dumps(dict(config=dict(network="alexnet", width=0.25),
                                                    dataset=dict(name="procedural"))))
  rows = [dict(step=s, split="train", loss=2.0 / s, top1=0.1 * s, top5=0.2 * s, learning_rate=0.01)
          for s in (1, 2, 3, 4)] + [dict(step=s, split="eval", loss=1.0, top1=0.2 * s, top5=0.3 * s) for s in (2, 4)]
  title = pictures.run_title(str(workdir), rows)
  assert title == "my_run: alexnet (width 0.25) on procedural, held-out top-1 80.0% at step 4"
  assert pictures.run_title(str(tmp_path / "other/"), rows).startswith("other, held-out")  # no run.json: its name
  fig = pictures.curves_figure(rows, title)
  try:
    assert fig._suptitle.get_text() == title
    accuracy = fig.axes[1]
    assert accuracy.get_ylabel() == "top-1 accuracy" and accuracy.get_ylim() == (0, 1.02)
    train, held_out = accuracy.lines
    assert train.get_marker() == "None" and train.get_linestyle() == "-" and list(train.get_xdata()) == [1, 2, 3, 4]
    assert held_out.get_marker() == "o" and list(held_out.get_xdata()) == [2, 4]
    assert list(held_out.get_ydata()) == [0.4, 0.8]  # accuracy, not error
    assert held_out.get_label() == "held-out images" and train.get_label() == "training batches"
  finally:
    pictures._pyplot().close(fig)


def test_write_all_writes_both_files_and_returns_the_towers_colour(tmp_path):
  filters = np.random.default_rng(1).normal(size=(2, 3, 11, 11, 12))
  filters[0] = filters[0].mean(axis=0, keepdims=True)  # tower a grey
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 10, "split": "train", "loss": 2.0, "top1": 0.1, "top5": 0.5}\n'
      '{"step": 10, "split": "eval", "loss": 1.9, "top1": 0.2, "top5": 0.6}\n')
  scores = pictures.write_all(str(tmp_path), filters, 10)
  assert set(scores) == {"colour_tower_a", "colour_tower_b"} and scores["colour_tower_a"] < 1e-12
  assert abs(scores["colour_tower_b"] - 2 / 3) < 0.05
  for name in ("curves.png", "conv1_filters.png"):
    assert Image.open(tmp_path / name).size[0] > 100
  caption = pictures.filters_caption(np.array(list(scores.values())), 24, "11×11", 10)
  assert caption.startswith("conv1's 24 filters (11×11 pixels, RGB) after 10 steps, each scaled to its own contrast")
  assert "top: tower a, bottom: tower b" in caption and "0.00 vs 0.6" in caption


def test_conv1_learned_shows_what_training_added_to_the_random_start(tmp_path):
  rng = np.random.default_rng(2)
  start = rng.normal(size=(2, 3, 11, 11, 12))
  grey_edge = np.broadcast_to(np.linspace(-1, 1, 11)[None, :, None], (11, 11, 12)) * 0.05
  trained = start + grey_edge[None, None]  # a small grey edge learned on top of loud coloured noise
  (tmp_path / "metrics.jsonl").write_text('{"step": 5, "split": "train", "loss": 2.0, "top1": 0.1, "top5": 0.5}\n')
  scores = pictures.write_all(str(tmp_path), trained, 5, initial=start)
  assert min(scores.values()) > 0.5  # the filters themselves: mostly their random colour
  change = pictures.colour_specialisation(trained - start)
  assert np.all(change < 1e-9)  # the change alone: grey
  assert Image.open(tmp_path / "conv1_learned.png").size[0] > 100
  caption = pictures.filters_caption(change, 24, "11×11", 5, change=True)
  assert caption.startswith("What training changed in conv1's 24 filters (11×11 pixels, RGB) after 5 steps: each "
                            "filter minus its random start") and "top: tower a, bottom: tower b" in caption


def test_the_random_start_is_remade_exactly_from_the_seed():
  # conv1_learned.png subtracts conv1 as create_train_state drew it, remade alone from the run's seed.
  config = paper_config()
  config.width, config.image_size = 0.0625, 64
  setup = train.make_setup(config, 10, 1000)
  drawn = train.create_train_state(setup, jax.random.key(7)).params["conv1"]["kernel"]
  remade = jax.jit(lambda key: train.initial_params(setup, key)["conv1"]["kernel"])(jax.random.key(7))
  np.testing.assert_array_equal(np.asarray(jax.device_get(drawn)), np.asarray(remade))
