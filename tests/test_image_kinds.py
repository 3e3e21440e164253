"""How an image becomes pixels, the same way for training, prepare and the API: EXIF orientation turned upright in one
place; every PIL mode made RGB as PIL's own conversion makes it; arrays read channels-last, a channels-first one
refused; images without pixels and decompression bombs refused, or skipped in their place among files."""

import logging
import struct
import warnings
import zlib

import numpy as np
import pytest
from PIL import Image

from alexnet_jax import api
from alexnet_jax.data import augment, decode, prepare, sources, store

SIZE = 32  # the side images are stored at, as a run's S


def noise(shape, seed=0) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, shape, np.uint8)


def blocks(h, w, seed=0) -> np.ndarray:
  """(h, w, 3) of flat 10×10 blocks: a JPEG keeps them nearly exact, and a turn moves every one of them."""
  return noise((h // 10, w // 10, 3), seed).repeat(10, 0).repeat(10, 1)


def rotated_jpeg(path, pixels) -> None:
  """A JPEG of `pixels` as stored, whose EXIF orientation (6) says: turn me 90° clockwise to view."""
  exif = Image.Exif()
  exif[0x0112] = 6
  Image.fromarray(pixels).save(path, quality=95, exif=exif.tobytes())


def chunk(kind: bytes, data: bytes) -> bytes:
  return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def bomb_png(path, side=20_000) -> None:
  """A 1-bit side×side PNG, all black: ~50 KB on disk, 400 M pixels once decoded, past PIL's decompression-bomb
  limit. Its rows compressed one at a time, never held whole."""
  squeeze = zlib.compressobj(1)
  row = bytes(1 + (side + 7) // 8)  # the filter byte, then the row's bits
  rows = b"".join(squeeze.compress(row) for _ in range(side)) + squeeze.flush()
  header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
  path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b""))


def test_a_rotated_jpeg_is_upright_in_training_prepare_and_the_api(tmp_path):
  for name in ("phone", "plain"):
    (tmp_path / "train" / name).mkdir(parents=True)
  path = tmp_path / "train" / "phone" / "rotated.jpg"
  rotated_jpeg(path, blocks(60, 90))
  Image.fromarray(blocks(60, 90, 1)).save(tmp_path / "train" / "plain" / "0.jpg", quality=95)
  raw = np.asarray(Image.open(path).convert("RGB"))  # as stored: 60 rows, 90 columns
  upright = np.rot90(raw, -1)  # 90 rows, 60 columns
  np.testing.assert_array_equal(sources.decode(str(path)), upright)
  np.testing.assert_array_equal(sources.decode(path.read_bytes()), upright)
  np.testing.assert_array_equal(sources.decode(str(path), SIZE), upright)  # a draft decode too
  folder, _, _ = sources.image_folders(str(tmp_path), "train", "train", SIZE)
  np.testing.assert_array_equal(folder[folder.files.index(str(path))]["image"], upright)
  stored = augment.resize_center_crop(upright, SIZE)
  trained = decode.Decoder(folder, SIZE)[folder.files.index(str(path))]["image"]
  np.testing.assert_array_equal(trained, stored)
  for given in (str(path), path, Image.open(path), [path]):
    np.testing.assert_array_equal(api.stored(given, SIZE), stored[None])
  # prepare stores it upright: a JPEG again, ~10 levels from its pixels on average, ~80 from the sideways ones
  splits, classes, described = prepare.folder_sources(str(tmp_path), ["train"], SIZE)
  prepare.write_store(str(tmp_path / "store"), splits, prepare.store_settings(described, classes, SIZE, 95), 1)
  record = store.open_split(str(tmp_path / "store"), "train")[folder.files.index(str(path))]["jpeg"]
  error = np.abs(store.decode_pil(record).astype(int) - stored).mean()
  assert error < 20 < np.abs(augment.resize_center_crop(raw, SIZE).astype(int) - stored).mean()


def test_an_image_without_a_turn_to_make_is_not_copied(tmp_path):
  Image.fromarray(noise((8, 8, 3))).save(tmp_path / "plain.jpg")
  with Image.open(tmp_path / "plain.jpg") as image:
    assert sources.upright(image) is image


def palette_image() -> Image.Image:
  """A 3×2 palette image of exact colours: entry 1 transparent."""
  image = Image.fromarray(np.array([[0, 1, 2], [2, 1, 0]], np.uint8), "P")
  image.putpalette([200, 30, 40, 20, 180, 60, 30, 60, 220])
  return image


def test_pil_images_of_every_mode_become_rgb_as_pil_converts_them():
  want = np.array([[(200, 30, 40), (20, 180, 60), (30, 60, 220)], [(30, 60, 220), (20, 180, 60), (200, 30, 40)]])
  index, per_entry = palette_image(), palette_image()
  index.info["transparency"] = 1
  per_entry.info["transparency"] = bytes([255, 0, 128])  # a PNG's tRNS: PIL warns converting it to RGB
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    for image in (palette_image(), index, per_entry):
      np.testing.assert_array_equal(sources.rgb(image), want)  # the palette's colours, the alpha dropped
  quarters = Image.fromarray(blocks(40, 60))
  for mode in ("1", "L", "LA", "P", "PA", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"):
    image = quarters.convert(mode)
    np.testing.assert_array_equal(sources.rgb(image), np.asarray(image.convert("RGB")), err_msg=mode)
    np.testing.assert_array_equal(api.stored(image, SIZE)[0], augment.resize_center_crop(sources.rgb(image), SIZE))
  la = Image.fromarray(np.stack([np.full((4, 4), 90, np.uint8), np.full((4, 4), 255, np.uint8)], -1), "LA")
  np.testing.assert_array_equal(sources.rgb(la.convert("La")), np.full((4, 4, 3), 90))  # PIL has no La → RGB
  grey16 = np.arange(0, 65536, 4096, dtype=np.uint16).reshape(4, 4)
  for image in (Image.fromarray(grey16), Image.frombytes("I;16B", (4, 4), grey16.astype(">u2").tobytes())):
    np.testing.assert_array_equal(sources.rgb(image), np.repeat((grey16 >> 8)[..., None], 3, -1), err_msg=image.mode)


def test_an_image_without_pixels_is_refused_in_one_line():
  for size in ((0, 10), (10, 0)):
    image = Image.new("RGB", size)
    with pytest.raises(ValueError, match=f"^a {size[0]}×{size[1]} image: it has no pixels$"):
      sources.rgb(image)  # training's and prepare's reading: UNREADABLE, so the file is skipped
    with pytest.raises(ValueError, match=f"^a {size[0]}×{size[1]} image: it has no pixels$"):
      api.stored([noise((8, 8, 3)), image], SIZE)


def test_arrays_are_read_channels_last_and_a_channels_first_one_is_refused():
  grey = noise((40, 50))
  np.testing.assert_array_equal(api.stored(grey, SIZE), api.stored(np.repeat(grey[..., None], 3, -1), SIZE))
  for shape in ((3, 40, 50), (3, 40, 3), (1, 40, 4), (4, 64, 1)):  # the last three would pass as strips of ≤ 4 rows
    with pytest.raises(ValueError, match=rf"^a 3-dimensional array \({shape[0]}, .* looks channels-first \(C, H, W\): "
                       r"pass \(H, W, C\), e\.g\. np\.transpose\(image, \(1, 2, 0\)\)$"):
      api.stored(np.zeros(shape, np.uint8), SIZE)
  with pytest.raises(ValueError, match=r"^a 4-dimensional array \(2, 3, 40, 3\) looks channels-first \(N, C, H, W\)"):
    api.images_of(np.zeros((2, 3, 40, 3), np.uint8))
  assert api.stored(np.zeros((4, 4, 3), np.uint8), SIZE).shape == (1, SIZE, SIZE, 3)  # tiny, but (H, W, C)


def test_paths_come_as_str_or_pathlib(tmp_path):
  Image.fromarray(noise((40, 50, 3))).save(tmp_path / "a.png")
  assert api.images_of(tmp_path / "a.png") == api.images_of(str(tmp_path / "a.png")) == [str(tmp_path / "a.png")]
  assert api.images_of(tmp_path) == [str(tmp_path / "a.png")]
  np.testing.assert_array_equal(api.stored(tmp_path / "a.png", SIZE), api.stored(str(tmp_path / "a.png"), SIZE))


@pytest.fixture(scope="module")
def bombed(tmp_path_factory):
  """root/train/{a,b}/: good PNGs, and a decompression bomb among a's."""
  root = tmp_path_factory.mktemp("bombed")
  for name in ("a", "b"):
    (root / "train" / name).mkdir(parents=True)
    for i in range(2):
      Image.fromarray(noise((40, 50, 3), i)).save(root / "train" / name / f"{i}.png")
  bomb_png(root / "train" / "a" / "1_bomb.png")
  return root


def test_a_decompression_bomb_among_files_is_skipped_with_its_reason(bombed):
  bomb, good = bombed / "train" / "a" / "1_bomb.png", bombed / "train" / "a" / "0.png"
  why = "Image size (400000000 pixels) exceeds limit of 178956970 pixels, could be decompression bomb DOS attack."
  with pytest.warns(UserWarning) as said:
    got = api.stored([good, bomb, good], SIZE)
  assert len(got) == 2 and [str(w.message) for w in said] == [f"skipped {bomb}: {why}"]
  with pytest.warns(UserWarning, match="1_bomb.png"):
    assert len(api.stored(bombed, SIZE)) == 4  # a folder: the 4 good files
  with pytest.raises(ValueError, match=f"^cannot read {bomb}: Image size"):
    api.stored(bomb, SIZE)


def test_a_decompression_bomb_is_passed_over_in_training_and_left_out_by_prepare(bombed, tmp_path, caplog):
  folder, _, _ = sources.image_folders(str(bombed), "train", "train", SIZE)
  at = folder.files.index(str(bombed / "train" / "a" / "1_bomb.png"))
  with pytest.raises(sources.UNREADABLE):
    folder[at]
  with caplog.at_level(logging.WARNING):
    example = decode.Decoder(folder, SIZE)[at]
  assert example["skipped"] == 1 and "1_bomb.png: Image size (400000000 pixels) exceeds limit" in caplog.text
  splits, classes, described = prepare.folder_sources(str(bombed), ["train"], SIZE)
  manifest, _ = prepare.write_store(str(tmp_path / "store"), splits, prepare.store_settings(described, classes, SIZE,
                                                                                           90), 1)
  assert manifest["splits"]["train"]["count"] == 4
  assert [e["index"] for e in manifest["splits"]["train"]["left_out"]] == [at]


def test_a_decompression_bomb_warning_made_an_error_is_a_skip_too(tmp_path, monkeypatch):
  """Between PIL's limit and twice it, PIL warns and decodes; where warnings are errors, its warning is raised."""
  Image.fromarray(noise((40, 50, 3))).save(tmp_path / "big.png")
  Image.fromarray(noise((8, 8, 3))).save(tmp_path / "small.png")
  monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1500)  # 40×50 = 2000 pixels: over it, under twice it
  with warnings.catch_warnings(record=True) as said:  # not pytest.warns: it would let every warning through
    warnings.simplefilter("always")
    warnings.simplefilter("error", Image.DecompressionBombWarning)
    with pytest.raises(sources.UNREADABLE):
      sources.decode(str(tmp_path / "big.png"))
    assert len(api.stored([tmp_path / "big.png", tmp_path / "small.png"], SIZE)) == 1
  assert [str(w.message) for w in said] == [f"skipped {tmp_path / 'big.png'}: Image size (2000 pixels) exceeds limit "
                                            "of 1500 pixels, could be decompression bomb DOS attack."]
