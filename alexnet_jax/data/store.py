"""The paper's storage: every image once at size×size as a JPEG, with its label, in array_record shards that Grain
reads by index. data/prepare.py writes a store (`make prepare … --store=OUT`); training opens its splits here.

A store is a directory OUT (no file names a path, so it moves whole; every file is written under a temporary name and
renamed when complete):
  OUT/<split>-NNNNN-of-MMMMM.array_record  shard k (from 0) of M, written 'group_size:1,uncompressed' so that
      reading image i reads only image i. A record: a 4-byte header, the label as a little-endian int32, the JPEG.
      Shard k holds the readable images among source indices [k·S, (k+1)·S) (S = shard_size), in source order.
  OUT/parts/<split>-NNNNN-of-MMMMM.json  each shard's record count, digest (shard_digest), left-out images and
      settings: what a rerun reads to skip the shards that are complete.
  OUT/manifest.json  written last, so its presence says the store is finished: the settings and, per split, count,
      shards, bytes, digests (checked when the split is opened; older stores have none) and left_out.
"""

import hashlib
import io
import json
import os
import struct

import grain
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter
from PIL import Image

from alexnet_jax.data.sources import TFDS_STATISTICS, UNREADABLE, DataError, decode, missing_split

FORMAT, VERSION = "alexnet_jax image store", 1
MANIFEST = "manifest.json"
WRITER_OPTIONS = "group_size:1,uncompressed"
HEADER = struct.Struct("<i")  # the label
SAMPLE = 4096  # bytes of a shard read at each of the places shard_digest reads
BLOCK = 65536  # array_record pads its files to blocks of this size


def shard_name(split: str, k: int, shards: int) -> str:
  return f"{split}-{k:05d}-of-{shards:05d}.array_record"


def part_path(root: str, split: str, k: int, shards: int) -> str:
  return os.path.join(root, "parts", shard_name(split, k, shards).replace(".array_record", ".json"))


def encode_record(label: int, jpeg: bytes) -> bytes:
  return HEADER.pack(label) + jpeg


def decode_record(record: bytes) -> dict:
  return dict(jpeg=record[HEADER.size:], label=HEADER.unpack_from(record)[0])


def write_shard(path: str, records: list[bytes]) -> str:
  """Writes the shard whole or not at all and returns its shard_digest; an OSError naming it where it cannot be
  (array_record raises a RuntimeError for a full disk)."""
  tmp = path + ".tmp"
  try:
    writer = ArrayRecordWriter(tmp, WRITER_OPTIONS)
    for record in records:
      writer.write(record)
    writer.close()
  except RuntimeError as e:
    reason = str(e).split("failed: ", 1)[-1].split(";")[0]  # "write() failed: File too large; writing …"
    raise OSError(f"{path}: {reason}") from None
  digest = shard_digest(tmp)
  os.replace(tmp, path)
  return digest


def shard_digest(path: str) -> str:
  """What tells this shard from any other, read in 8 KiB: its size; its first bytes, which hold the first record
  and the hash riegeli keeps of its chunk; and the start of its last 64 KiB block, where array_record writes the
  offset of its index of records (the rest of that block is padding). A whole-file hash would read a store of
  ImageNet (140 GB) on every start."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    size = os.fstat(f.fileno()).st_size
    digest.update(size.to_bytes(8, "little"))
    for offset in (0, max(0, size - BLOCK)):
      f.seek(offset)
      digest.update(f.read(SAMPLE))
  return digest.hexdigest()[:32]


def count_records(path: str) -> int | None:
  """The number of records in a shard (read from its footer), or None if there is no readable shard at path."""
  if not os.path.isfile(path):
    return None
  try:
    reader = ArrayRecordReader(path)
    count = reader.num_records()
    reader.close()  # a damaged file can fail here too
  except (OSError, RuntimeError, ValueError):
    return None
  return count


def write_json(path: str, value) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(value, f, indent=1)
  os.replace(path + ".tmp", path)


def read_json(path: str):
  with open(path) as f:
    return json.load(f)


def _no_manifest(root: str) -> DataError:
  """Why root, without a manifest, is no store: no directory at all, one that a store was never written to, or one
  that make prepare stopped writing (its shards or parts are there), which only a rerun finishes."""
  prepare = f"make prepare ARGS='--name=… --data_dir=… --store={root}'"
  if not os.path.isdir(root):
    return DataError(f"no such directory: {root}" if root else "no store: set --config.dataset.data_dir to the "
                     "directory that make prepare wrote")
  inside = sorted(name for name in os.listdir(root) if os.path.isfile(os.path.join(root, name, MANIFEST)))
  if inside:  # `mv store elsewhere` into a directory that exists moves the store into it
    more = f" (and {len(inside) - 1} more)" if len(inside) > 1 else ""
    return DataError(f"{root} holds no store itself (no {MANIFEST}), but {os.path.join(root, inside[0])}{more} "
                     f"inside it is one: set --config.dataset.data_dir={os.path.join(root, inside[0])}")
  if not any(name == "parts" or name.endswith((".array_record", ".tmp")) for name in os.listdir(root)):
    return DataError(f"{root} holds no store (no {MANIFEST}): {prepare} writes one")
  return DataError(f"{root} is not a finished store (no {MANIFEST}); rerun {prepare} with the arguments that began "
                   "it")


def read_manifest(root: str) -> dict:
  """The manifest of the store at root; DataError if root is no finished store of this format version."""
  path = os.path.join(root, MANIFEST)
  if not os.path.isfile(path):
    raise _no_manifest(root)
  try:
    manifest = read_json(path)
  except (OSError, ValueError) as e:
    raise DataError(f"{path} is unreadable ({e}); rerun make prepare into a new --store") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise DataError(f"{path} is not the manifest of an alexnet_jax image store")
  if manifest.get("version") != VERSION:
    raise DataError(f"{root} is a store of format version {manifest.get('version')}, this code reads version "
                    f"{VERSION}; rerun make prepare into a new --store")
  if problem := _malformed(manifest):
    raise DataError(f"{path} is malformed ({problem}); rerun make prepare into a new --store")
  return manifest


def _malformed(manifest: dict) -> str | None:
  """What is wrong with a manifest's fields that readers use, or None."""
  fields = dict(splits=dict, size=int, num_classes=int, source=dict)
  for name, kind in fields.items():
    if not isinstance(manifest.get(name), kind) or isinstance(manifest.get(name), bool):
      return f"'{name}' is not {'an integer' if kind is int else 'an object'}"
  if not isinstance(manifest.get("classes", []), list):
    return "'classes' is not a list"
  for split, entry in manifest["splits"].items():
    if not isinstance(entry, dict) or not all(isinstance(entry.get(k), int) and entry[k] >= 0 and
                                              not isinstance(entry[k], bool) for k in ("count", "shards")):
      return f"split {split!r} lacks an integer count or shards"
    digests = entry.get("digests", [])
    if not isinstance(digests, list) or len(digests) not in (0, entry["shards"]) or not all(
        isinstance(d, str) for d in digests):
      return f"split {split!r} has no digest for each of its shards"
  return None


class StoreSplit:
  """One split of a store: len() and [i] → {'jpeg': bytes, 'label': int}, undecoded (decode_pil, or the
  pipeline's decoder, decodes). As every source tells the pipeline: `resize`, the images' side S (they are S×S);
  `statistics`, the source's published pixel statistics, if any (sources.TFDS_STATISTICS), else None. And
  `classes`, the class names, from the manifest."""

  def __init__(self, root: str, split: str, manifest: dict):
    entry = manifest["splits"][split]
    paths = [os.path.join(root, shard_name(split, k, entry["shards"])) for k in range(entry["shards"])]
    missing = [os.path.basename(p) for p in paths if not os.path.isfile(p)]
    if missing:
      raise DataError(f"store {root} lacks {missing[0]} ({len(missing)} shards missing); rerun make prepare with "
                      f"--store={root} to write them again")
    self.root, self.paths = root, paths
    try:
      self.records = grain.sources.ArrayRecordDataSource(paths)
    except RuntimeError:  # array_record cannot open a shard: name it
      raise self._damaged(None) from None
    self._check_digests(entry.get("digests") or [])
    if len(self.records) != entry["count"]:
      raise DataError(f"store {root}: split {split!r} has {len(self.records)} images, its manifest says "
                      f"{entry['count']}; rerun make prepare with --store={root}")
    self.resize = manifest["size"]
    self._check_size()
    self.classes = tuple(manifest.get("classes") or map(str, range(manifest["num_classes"])))
    self.statistics = TFDS_STATISTICS.get(manifest["source"].get("tfds"))

  def _check_digests(self, digests: list[str]) -> None:
    """A shard that is not the one the manifest was written with (copied in from another store, or changed since)
    would train without a word: it is named. A store without digests (written before them) is not checked."""
    for path, digest in zip(self.paths, digests):
      if shard_digest(path) != digest:
        raise DataError(f"store {self.root}: shard {os.path.basename(path)} is not the one its {MANIFEST} was written "
                        f"with (copied from another store, or changed since); rerun make prepare with "
                        f"--store={self.root}, which writes it again")

  def _check_size(self) -> None:
    """The first image against the manifest's size, which the pipeline would otherwise trust, resizing every
    image to it."""
    if not len(self.records):
      return
    try:
      width, height = Image.open(io.BytesIO(self[0]["jpeg"])).size  # the header alone
    except UNREADABLE:
      return  # the decoder names an unreadable image when it meets it
    if (width, height) != (self.resize, self.resize):
      raise DataError(f"store {self.root}: its {MANIFEST} says 'size' {self.resize}, but its images are "
                      f"{width}×{height} ({self.where(0)}); rerun make prepare into a new --store")

  def __len__(self):
    return len(self.records)

  def __getitem__(self, i):
    try:
      return decode_record(self.records[i])
    except RuntimeError:  # array_record cannot read the record: its shard is damaged
      raise self._damaged(i) from None

  def where(self, i: int) -> str:
    """Example i's shard and record, for messages."""
    shard, record = self._locate(i)
    return f"{os.path.basename(self.paths[shard])}, record {record}"

  def _locate(self, i: int) -> tuple[int, int]:
    start = 0
    for shard, path in enumerate(self.paths):
      n = len(grain.sources.ArrayRecordDataSource([path]))
      if i < start + n:
        return shard, i - start
      start += n
    raise IndexError(i)

  def _damaged(self, i: int | None) -> DataError:
    """The DataError naming the damaged shard (of example i, or the first that does not open)."""
    name = None
    if i is not None:
      name = os.path.basename(self.paths[self._locate(i)[0]])
    else:
      for path in self.paths:
        try:
          grain.sources.ArrayRecordDataSource([path])
        except RuntimeError:
          name = os.path.basename(path)
          break
    return DataError(f"store {self.root}: shard {name or '?'} is damaged (truncated or overwritten); rerun make "
                     f"prepare with --store={self.root}, which writes it again")


def open_split(root: str, split: str, key: str = "", other: str = "") -> StoreSplit:
  """Split `split` of the store at root; a split it lacks is reported with those it has (sources.missing_split: `key`
  and `other` name the config key to set)."""
  manifest = read_manifest(root)
  if split not in manifest["splits"]:
    raise missing_split(f"the store {root}", split, list(manifest["splits"]), key, other)
  return StoreSplit(root, split, manifest)


def open_splits(root: str, train_split: str, eval_split: str) -> tuple[StoreSplit, StoreSplit]:
  """The splits that config.dataset.train_split and eval_split name."""
  return (open_split(root, train_split, "dataset.train_split", eval_split),
          open_split(root, eval_split, "dataset.eval_split", train_split))


def decode_pil(jpeg: bytes):
  """(S, S, 3) uint8: the reference decoder (PIL, through sources.decode), for tests and fallbacks."""
  return decode(jpeg)

