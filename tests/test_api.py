"""The Python API and scripts/predict.py on what people hand them: paths, folders and their subfolders, PIL images of
any mode, arrays of one image or a batch, lists of them mixed; one preprocessing for all of them, EXIF orientation
applied; unreadable files skipped in their place, with the reason; bad arrays, k and outputs refused in one line."""

import csv
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image, ImageOps
from test_image_kinds import bomb_png

import alexnet_jax
from alexnet_jax import api
from alexnet_jax.config import KEYS, network_table, paper_config
from alexnet_jax.data import get_dataset
from alexnet_jax.training import checkpoints, loop, train
from alexnet_jax.training import run as run_files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The folder's images in the API's order: sorted by path folder by folder (a string sort puts cats-2/ before cats/).
ORDER = ["a.jpg", "broken.jpg", "cats/deeper/z.jpg", "cats/x.png", "cats-2/y.png", "rotated.jpg", "truncated.png"]
UNREADABLE = {"broken.jpg": "not an image that PIL can read", "truncated.png": "image file is truncated"}


def make_run(workdir: str) -> None:
  """A run's directory as training leaves it (run.json, a checkpoint), of the demo's network at 1/16 width on 64×64
  images, its weights fresh: what loading and predicting read, without the minutes of training."""
  config = alexnet_jax.get_config("demo")
  config.width, config.image_size, config.batch_size, config.eval_batch_size = 0.0625, 64, 4, 4
  config.dataset.num_train_examples, config.dataset.num_eval_examples = 8, 4
  dataset = get_dataset(config)
  setup = train.dataset_setup(config, dataset)
  state = train.create_train_state(setup, jax.random.key(config.seed))
  described = run_files.describe(config, dataset, setup.net.table)
  run_files.write(workdir, described)
  manager = checkpoints.manager(workdir, config)
  checkpoints.save(manager, 1, state, loop.data_position(config, dataset, 1), described)
  manager.wait_until_finished()


@pytest.fixture(scope="module")
def workdir(once):
  return once("api_run", make_run)[0]


@pytest.fixture(scope="module")
def model(workdir):
  return alexnet_jax.load(workdir)


def noise(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, shape, np.uint8)


def rotated_jpeg(path) -> None:
  """A JPEG whose EXIF says: turn me 90° clockwise to view."""
  exif = Image.Exif()
  exif[0x0112] = 6
  Image.fromarray(noise((60, 90, 3), 1)).save(path, exif=exif.tobytes())


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> pathlib.Path:
  folder = tmp_path_factory.mktemp("photos")
  for sub in ("cats/deeper", "cats-2"):
    (folder / sub).mkdir(parents=True)
  Image.fromarray(noise((200, 300, 3))).save(folder / "a.jpg", quality=90)  # large enough for a draft decode
  Image.fromarray(noise((70, 50), 2)).save(folder / "cats" / "x.png")
  Image.fromarray(noise((64, 64, 3), 3)).save(folder / "cats" / "deeper" / "z.jpg")
  Image.fromarray(noise((80, 80, 4), 4)).save(folder / "cats-2" / "y.png")
  rotated_jpeg(folder / "rotated.jpg")
  (folder / "broken.jpg").write_bytes(b"these are no pixels")
  png = (folder / "cats" / "x.png").read_bytes()
  (folder / "truncated.png").write_bytes(png[:len(png) // 2])
  (folder / "notes.txt").write_text("not an image, and not named like one")
  return folder


def test_a_folder_gives_its_images_and_its_subfolders_sorted_by_path(photos):
  assert api.image_files(str(photos)) == [str(photos / name) for name in ORDER]
  assert api.images_of(photos) == api.images_of(str(photos)) == api.image_files(str(photos))


def test_paths_pil_images_arrays_and_lists_of_them_are_taken_one_image_at_a_time(model, photos):
  s = model.run.size
  one = noise((150, 200, 3))
  assert model.stored(str(photos / "a.jpg")).shape == model.stored(photos / "a.jpg").shape == (1, s, s, 3)
  assert model.stored(one).shape == (1, s, s, 3)  # one (H, W, 3) image, not 150 rows
  assert model.stored(Image.open(photos / "a.jpg")).shape == (1, s, s, 3)
  grey = np.repeat(one[..., :1], 3, -1)
  same = {"(H, W)": (one[..., 0], grey), "(H, W, 1)": (one[..., :1], grey),
          "(H, W, 4)": (np.concatenate([one, one[..., :1]], -1), one), "uint16": (one.astype(np.uint16) << 8 | 7, one)}
  for name, (image, want) in same.items():
    np.testing.assert_array_equal(model.stored(image), model.stored(want), err_msg=name)
  batch = np.stack([one, noise((150, 200, 3), 5)])
  mixed = model.stored([photos / "cats", batch, Image.open(photos / "a.jpg"), str(photos / "a.jpg"), iter([one])])
  assert len(mixed) == 2 + 2 + 1 + 1 + 1
  np.testing.assert_array_equal(mixed[2:4], model.stored(batch))
  np.testing.assert_array_equal(mixed[4], mixed[5])
  assert len(model.top(batch)) == 2 and model.stored([]).shape == (0, s, s, 3) and model.predict([]).shape == (0, 10)


def test_a_file_its_pil_image_and_its_pixels_score_the_same(model, photos):
  path = str(photos / "a.jpg")
  pixels = np.asarray(Image.open(path).convert("RGB"))
  np.testing.assert_array_equal(model.stored(path), model.stored(pixels))  # not PIL's draft decode for a path
  np.testing.assert_array_equal(model.predict(path), model.predict(pixels))
  np.testing.assert_array_equal(model.predict(path), model.predict(Image.open(path)))
  assert model.top(path, k=3) == model.top([pixels], k=3)


def test_exif_orientation_turns_files_and_pil_images_upright(model, photos):
  path = str(photos / "rotated.jpg")
  raw = np.asarray(Image.open(path).convert("RGB"))  # as stored: 60 rows, 90 columns
  upright = model.stored(np.rot90(raw, -1))  # turned 90° clockwise, as the EXIF orientation asks
  assert not np.array_equal(upright, model.stored(raw))
  np.testing.assert_array_equal(model.stored(path), upright)
  np.testing.assert_array_equal(model.stored(Image.open(path)), upright)
  np.testing.assert_array_equal(model.stored(np.asarray(ImageOps.exif_transpose(Image.open(path)))), upright)


def test_pil_images_of_every_mode_become_their_rgb_pixels(model):
  colours = np.array([[(200, 30, 40), (20, 180, 60)], [(30, 60, 220), (240, 230, 20)]], np.uint8)
  quarters = colours.repeat(40, 0).repeat(50, 1)  # (80, 100, 3), four flat colours
  rgb = Image.fromarray(quarters)
  grey = model.stored(np.asarray(rgb.convert("L")))
  alpha = Image.fromarray(np.concatenate([quarters, noise((80, 100, 1))], -1))
  cases = {"P": (rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=4), model.stored(quarters), 0),
           "CMYK": (rgb.convert("CMYK"), model.stored(quarters), 0),
           "RGBA": (alpha, model.stored(quarters), 0),
           "YCbCr": (rgb.convert("YCbCr"), model.stored(quarters), 4),
           "HSV": (rgb.convert("HSV"), model.stored(quarters), 6),  # hue taken as red would be off by 100s
           "L": (rgb.convert("L"), grey, 0), "LA": (rgb.convert("LA"), grey, 0),
           "I;16": (Image.fromarray(np.asarray(rgb.convert("L")).astype(np.uint16) * 257), grey, 0)}
  for mode, (image, want, tolerance) in cases.items():
    assert image.mode == mode
    got = model.stored(image)
    assert np.abs(got.astype(int) - want).max() <= tolerance, mode
  for mode in ("I", "F"):
    with pytest.raises(ValueError, match=rf"pixels \(PIL mode {mode}\) of unknown range"):
      model.stored(rgb.convert(mode))


def test_arrays_that_are_not_images_are_refused_in_one_line_naming_what_was_given(model):
  refused = {(3, 64, 80): r" looks channels-first \(C, H, W\): pass \(H, W, C\), e\.g\. np\.transpose\(image, ",
             (2, 3, 64, 80): r" looks channels-first \(N, C, H, W\): pass \(N, H, W, C\), e\.g\. np\.transpose",
             (64, 80, 2): r": an image is \(H, W\) grey or \(H, W, C\), a batch \(N, H, W, C\), with C 1, 3 or 4$",
             (5,): ": an image is", (1, 2, 8, 8, 3): ": an image is"}
  for shape, message in refused.items():
    with pytest.raises(ValueError, match=f"^a {len(shape)}-dimensional array {re.escape(str(shape))}{message}"):
      model.predict(np.zeros(shape, np.uint8))
  with pytest.raises(ValueError, match=r"^a \(0, 8, 3\) array: its images are empty$"):
    model.predict(np.zeros((0, 8, 3), np.uint8))
  for dtype in (np.float32, np.int64, np.bool_):
    with pytest.raises(ValueError, match=f"^{np.dtype(dtype)} pixels: images are uint8 \\(or uint16\\) arrays"):
      model.top(np.zeros((8, 8, 3), dtype))
  with pytest.raises(ValueError, match=r"^item 1: float64 pixels"):
    model.stored([np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8, 3))])
  with pytest.raises(TypeError, match="^int: images are paths"):
    model.stored(42)


def test_unreadable_files_in_a_folder_or_a_list_are_skipped_in_their_place(model, photos):
  with pytest.warns(UserWarning) as said:
    top = model.top(photos, k=2)
    probs = model.predict(photos)  # 7 images: two batches of 4, a skipped one in each
  assert [t is None for t in top] == [name in UNREADABLE for name in ORDER]
  assert np.isnan(probs).all(1).tolist() == [name in UNREADABLE for name in ORDER]
  readable = [str(photos / name) for name in ORDER if name not in UNREADABLE]
  alone = model.predict(readable)  # in other batches: equal to float rounding
  np.testing.assert_allclose(probs[~np.isnan(probs).all(1)], alone, rtol=1e-5)
  assert [[c for c, _ in t] for t in top if t] == [[model.classes[c] for c in np.argsort(-p)[:2]] for p in alone]
  assert [str(w.message) for w in said] == [f"skipped {photos / name}: {why}" for name, why in UNREADABLE.items()] * 2
  assert all(w.filename == __file__ for w in said)  # the caller's line, not the package's
  with pytest.warns(UserWarning, match="broken.jpg"):
    assert len(model.stored([photos / "a.jpg", photos / "broken.jpg", photos / "a.jpg"])) == 2
  with pytest.warns(UserWarning, match="broken.jpg"):
    assert model.top([photos / "broken.jpg", noise((9, 9, 3))], k=1)[0] is None


def test_a_file_given_alone_that_cannot_be_read_and_a_path_that_is_not_there_are_refused(model, photos, tmp_path):
  with pytest.raises(ValueError, match=f"^cannot read {photos / 'broken.jpg'}: not an image that PIL can read$"):
    model.top(photos / "broken.jpg")
  with pytest.raises(ValueError, match=f"^cannot read {photos / 'notes.txt'}: "):
    model.predict(str(photos / "notes.txt"))
  with pytest.raises(ValueError, match=f"^item 1: {tmp_path / 'nope.jpg'}: no such file or folder$"):
    model.predict([photos / "a.jpg", tmp_path / "nope.jpg"])
  (tmp_path / "empty" / "sub").mkdir(parents=True)
  with pytest.raises(ValueError, match=f"^{tmp_path / 'empty'}: no images \\(.jpg, .*\\) in the folder or its "):
    model.predict(tmp_path / "empty")


def test_k_is_at_least_one_and_more_than_the_classes_names_them_all(model):
  image = noise((40, 40, 3))
  for k in (0, -1, 2.5):
    with pytest.raises(ValueError, match=f"^k must be a whole number ≥ 1 \\(the classes to name per image\\), not "
                                         f"{k}$"):
      model.top(image, k=k)
  (every,) = model.top(image, k=100)
  assert sorted(c for c, _ in every) == sorted(model.classes) and sum(p for _, p in every) == pytest.approx(1, 1e-5)
  with pytest.raises(ValueError, match="^crops must be 1"):
    model.predict(image, crops=3)


def test_k_is_checked_by_one_public_rule():
  for k in (0, -1, 2.5, "3", True, None):
    with pytest.raises(ValueError, match=f"^k must be a whole number ≥ 1 \\(the classes to name per image\\), not "
                                         f"{re.escape(repr(k))}$"):
      api.check_top(k)
  assert api.check_top(np.int64(3)) == 3 and type(api.check_top(np.int64(3))) is int


def test_a_decompression_bomb_among_files_is_skipped_and_the_others_answered(model, photos, tmp_path):
  bomb = tmp_path / "bomb.png"
  bomb_png(bomb)
  good = [photos / "a.jpg", photos / "cats" / "x.png"]
  with pytest.warns(UserWarning, match=f"^skipped {bomb}: Image size \\(400000000 pixels\\) exceeds limit"):
    probs = model.predict([good[0], bomb, good[1]])
  assert np.isnan(probs[1]).all() and not np.isnan(probs[[0, 2]]).any()
  np.testing.assert_allclose(probs[[0, 2]], model.predict(good), rtol=1e-5)
  with pytest.warns(UserWarning, match="bomb.png"):
    assert [t is None for t in model.top([bomb, good[0]], k=2)] == [True, False]


def predict(*args, timeout=300):
  return subprocess.run([sys.executable, "scripts/predict.py", *map(str, args)], cwd=ROOT, capture_output=True,
                        text=True, timeout=timeout)


def test_predict_script_descends_into_folders_and_lists_skipped_files_in_json_and_csv(model, workdir, photos, tmp_path):
  done = predict("--workdir", workdir, "--batch=4", "--top=2", "--json", tmp_path / "out.json", "--csv",
                 tmp_path / "out.csv", photos)
  assert done.returncode == 0, done.stderr[-3000:]
  readable = [str(photos / name) for name in ORDER if name not in UNREADABLE]
  assert [line.split(": ")[0] for line in done.stdout.strip().splitlines()] == readable
  assert [line for line in done.stderr.splitlines() if line.startswith("skipped ")] == [
      f"skipped {photos / 'broken.jpg'}: not an image that PIL can read",
      f"skipped {photos / 'truncated.png'}: image file is truncated"]
  rows = json.loads((tmp_path / "out.json").read_text())
  assert [r["path"] for r in rows] == [str(photos / name) for name in ORDER]
  assert {os.path.basename(r["path"]): r["skipped"] for r in rows if "skipped" in r} == {
      "broken.jpg": "not an image that PIL can read", "truncated.png": "image file is truncated"}
  for row, best in zip([r for r in rows if "top" in r], model.top(readable, k=2)):  # the API's answer
    assert [(t["class"], t["probability"]) for t in row["top"]] == [(c, pytest.approx(p, rel=1e-5)) for c, p in best]
  with open(tmp_path / "out.csv", newline="") as f:
    table = list(csv.reader(f))
  assert table[0] == ["path", "rank", "class", "probability", "skipped"]
  assert [r for r in table[1:] if r[4]] == [[str(photos / "broken.jpg"), "", "", "", "not an image that PIL can read"],
                                            [str(photos / "truncated.png"), "", "", "", "image file is truncated"]]
  assert [(r[0], r[1]) for r in table[1:] if not r[4]] == [(path, rank) for path in readable for rank in "12"]


def test_predict_script_refuses_a_top_below_one_and_outputs_over_the_run_s_files_before_writing(workdir, photos):
  before = {f: open(os.path.join(workdir, f), "rb").read() for f in os.listdir(workdir) if f.endswith(".json")}
  image = (photos / "a.jpg").read_bytes()
  refused = {("--top=0",): "error: --top must be ≥ 1", ("--top=-3",): "error: --top must be ≥ 1",
             ("--json", os.path.join(workdir, "run.json")): f"error: --json {workdir}/run.json is a file of the run",
             ("--csv", os.path.join(workdir, "checkpoints", "p.csv")): f"error: --csv {workdir}/checkpoints/p.csv is a "
             "file of the run", ("--json", photos / "a.jpg"): f"error: --json {photos / 'a.jpg'} is one of the inputs"}
  for flags, message in refused.items():
    done = predict("--workdir", workdir, *flags, photos)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith(message), done.stderr[-2000:]
  assert {f: open(os.path.join(workdir, f), "rb").read() for f in before} == before
  assert not os.path.exists(os.path.join(workdir, "checkpoints", "p.csv"))
  assert (photos / "a.jpg").read_bytes() == image


def test_a_run_json_without_later_keys_still_loads():
  # A run.json written before a key existed (dataset.host_cache_bytes, warmup_steps, …) reads at the key's paper
  # value; a key outside LATER_KEYS missing is a damaged file, refused as before.
  config = paper_config()
  config.dataset.name, config.dataset.num_classes, config.width, config.image_size = "procedural", 10, 0.25, 64
  dataset = get_dataset(config)
  described = run_files.describe(config, dataset, network_table(config, dataset.num_classes))
  for name in ("dataset.flip", "num_steps", "warmup_steps", "dataset.host_cache_bytes"):  # added after version 1
    *parents, leaf = name.split(".")
    node = described["config"]
    for part in parents:
      node = node[part]
    del node[leaf]
  loaded = run_files.from_description(json.loads(json.dumps(described)))
  assert loaded.config.dataset.host_cache_bytes == KEYS["dataset.host_cache_bytes"].value
  del described["config"]["dataset"]["cache_bytes"]
  with pytest.raises(KeyError, match="cache_bytes"):
    run_files.from_description(described)
