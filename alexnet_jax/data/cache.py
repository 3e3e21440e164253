"""Decoded training images kept in device memory (config.dataset.cache 'device' or 'sharded'), in the host's ('host'),
or in both ('tiered'), so that an image is decoded once per run instead of once per epoch. docs/data.md describes them.

Which and when (`Schedule`): the first `slots` images of the training split, each in slot = its index; under
'tiered' the slots below `device_slots` on the devices and the others in this process's memory. A run (re)starts with
an empty cache and decodes every image up to the end of the first whole epoch after its start (`fill_end`), writing
the cacheable ones as they pass; from there on a row whose image has a slot comes from the cache. Both are pure
functions of (seed, step, start): a batch is the same images and labels with or without the cache, and a resumed run
refills it. A host batch under the cache (Dataset.cached_train_batch) carries 'image' (B·K, S, S, 3), each of its B
row blocks' decoded rows first in a block of K; 'decoded' (N,) int32, a row's position in its block's K or −1 where
it comes from the cache; 'index' (N,) int32, the slots; 'label' (N,) int32, −1 for the cached rows; under 'tiered'
also 'sent' () int32, K′: the rows each block sends the devices (its decoded and host-tier rows, padded as K is),
from the global batch so that every process sends as many. CachedPut assembles the contract's batch on the devices
and writes the decoded rows into the cache, which every device holds whole (all copies kept equal) or, sharded, a
block of the slots each, one reduce-scatter handing each device its rows. HostCachedPut assembles the batch in this
process's memory and places it; TieredCachedPut assembles there the rows the devices do not hold, places them as
HostCachedPut does and has the devices complete the batch as CachedPut does. The host's puts take several consecutive
batches at once (GROUP_ROWS), each row block's rows of each batch in turn (_in_turn), which the devices split again.
"""

import collections
import concurrent.futures
import dataclasses
import functools
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.data import host_memory
from alexnet_jax.data.device_batches import HostPut, BatchLayout, check_batch
from alexnet_jax.data.sources import DataError

MARGIN = 1 << 30  # device memory left free beside the step's and the feed's needs: the allocator's fragmentation
COPY_THREADS = min(8, len(os.sched_getaffinity(0)))  # the host cache's copies: memory's bandwidth, not the cores
WRITE_THREADS = max(1, COPY_THREADS // 2)  # the host cache's writes, behind the feed and beside its copies
WRITES_AHEAD = 4  # puts whose writes may still be under way: each holds its batches' decoded images
GROUP_ROWS = 512  # of this process's rows: a host cache's put takes as many consecutive batches together
SHAPES = 8  # a block's decoded rows are padded to a multiple of 1/SHAPES of it: at most SHAPES compiled assemblies


def image_bytes(size: int) -> int:
  """A cached image's bytes on each device: its S×S×3 pixels and its label."""
  return size * size * 3 + 4


@dataclasses.dataclass(frozen=True)
class Schedule:
  """Which rows of training step `step`'s global batch come from the cache: those whose image has a slot (index <
  slots) and whose position lies at or after fill_end."""

  slots: int
  num_train: int
  batch_size: int
  blocks: int  # the row blocks of a batch: its shards over the mesh's row axes
  start: int  # the step the run (re)started at, with an empty cache
  device_slots: int = 0  # 'tiered': the slots below it lie on the devices, the others in this process's memory

  @property
  def tiered(self) -> bool:
    """Whether each tier holds some of the slots ('tiered' that neither the devices nor the host take whole)."""
    return 0 < self.device_slots < self.slots

  @property
  def fill_end(self) -> int:
    """The row position after the first whole epoch that begins at or after the start."""
    first = -(-self.start * self.batch_size // self.num_train)
    return (first + 1) * self.num_train

  def writes(self, step: int) -> bool:
    """Whether step's batch may hold decoded rows that the cache takes: any before fill_end."""
    return self.slots > 0 and step * self.batch_size < self.fill_end

  def cached(self, step: int, indices: np.ndarray) -> np.ndarray:
    """(N,) bool over the global batch of `step`, examples `indices`: the rows read from the cache."""
    positions = step * self.batch_size + np.arange(len(indices))
    return (np.asarray(indices) < self.slots) & (positions >= self.fill_end)

  def padded(self, decoded_per_block: int) -> int:
    """K, the rows each block's decoded images take: a multiple of an eighth of a block, or one row where nothing
    is decoded (the whole batch cached)."""
    quantum = max(1, self.batch_size // self.blocks // SHAPES)
    return max(1, -(-decoded_per_block // quantum) * quantum)


def layout(rule: Schedule, step: int, indices: np.ndarray, rows: slice) -> tuple[np.ndarray, int]:
  """For this process's `rows` of step's global batch (examples `indices`, the global batch's): ('decoded' (n,)
  int32: each decoded row's place in its block's K, −1 for a cached one; K). K is the same on every process: from
  the global batch's busiest block."""
  block = rule.batch_size // rule.blocks
  decoded = (~rule.cached(step, indices)).reshape(rule.blocks, block)
  k = rule.padded(int(decoded.sum(1).max()))
  places = np.where(decoded, np.cumsum(decoded, axis=1) - 1, -1).reshape(-1).astype(np.int32)
  return places[rows], k


def sent_per_block(rule: Schedule, step: int, indices: np.ndarray) -> np.ndarray:
  """'sent' of step's host batch under a tiered rule (examples `indices`, the global batch's): K′, the rows the
  global batch's busiest block sends the devices, all but those the device tier holds, padded as K is."""
  from_devices = rule.cached(step, indices) & (np.asarray(indices) < rule.device_slots)
  sent = (~from_devices).reshape(rule.blocks, -1).sum(1).max()
  return np.int32(rule.padded(int(sent)))


class CachedPut(HostPut):
  """put([host batch under the cache]) → finish, as data.feed.Feed takes it: the decoded rows and the draws placed on
  the mesh, the contract's batch assembled on the devices from them and the cache, the decoded rows with slots
  written into the cache. Batches must come in order from rule.start: whether one writes follows the step.
  The assembly is finish's, which the feed calls after it has put the next batch: by then the placed rows have had
  that put's time to cross to the devices, where called straight after their put it held the feed's thread longer
  (docs/BENCHMARKS.md, the tiered cache's rows)."""

  def __init__(self, rows: BatchLayout, size: int, image_size: int, rule: Schedule, sharded: bool = False):
    super().__init__(rows, size, image_size)
    self.rule, self.step, self.sharded = rule, rule.start, sharded
    # sharded: row block b holds slots [b·k, (b+1)·k), k = held / blocks; the last block's tail is never written
    held = -(-rule.slots // rows.blocks) * rows.blocks if sharded else rule.slots
    where = NamedSharding(rows.mesh, P(rows.axes) if sharded else P())
    self.images = jax.jit(lambda: jnp.zeros((held, size, size, 3), jnp.uint8), out_shardings=where)()
    self.labels = jax.jit(lambda: jnp.zeros((held,), jnp.int32), out_shardings=where)()
    self._assemble = {}  # (each batch's writes, the arrays' ranks) → the jitted assembly

  def put(self, batches: list[dict]):
    batch, = batches
    _decoded_per_block(batch, self.rule)
    check_batch(batch, self.size, self.image_size)
    on_device = self.rows.put(batch)
    return lambda: [(b, 0) for b in self.assemble(on_device, 1)]

  def assemble(self, on_device: dict, group: int) -> list[dict]:
    """The contract's batches of `group` consecutive steps from their arrays placed together (each row block's rows
    of each batch in turn: `image` K a batch, the others a block's rows) and the cache, which takes the decoded rows
    with slots first where a step writes."""
    writes = tuple(self.rule.writes(step) for step in range(self.step, self.step + group))
    key = writes, tuple((k, v.ndim) for k, v in on_device.items())
    if key not in self._assemble:
      self._assemble[key] = _assembly(self.rows, self.rule.slots, writes, dict(key[1]), self.sharded)
    self.images, self.labels, batches = self._assemble[key](self.images, self.labels, on_device)
    self.step += group
    return batches


class HostCachedPut(HostPut):
  """put(host batches under the cache) → finish, as CachedPut, with the cache in this process's memory: the batches'
  decoded rows and the cache's assembled here, the decoded rows with slots written into the cache, the batches placed
  as decoded ones. Batches must come in order from rule.start. The cache holds slots [rule.device_slots,
  rule.slots): all of them, or under 'tiered' those the devices do not (TieredCachedPut).
  A put takes `group` consecutive batches, `group_rows` of this process's rows, together: the host's cost of a put
  (starting the copies, the puts, the devices' assembly) hardly depends on its rows, Python holding the GIL against
  the training loop's thread, and at small batches it bound the feed (docs/BENCHMARKS.md, the tiered cache's rows)."""

  def __init__(self, rows: BatchLayout, size: int, image_size: int, rule: Schedule, group_rows: int = GROUP_ROWS):
    super().__init__(rows, size, image_size)
    self.rule, self.step, self.first = rule, rule.start, rule.device_slots
    share = rows.process_rows(rule.batch_size)
    self.group = max(1, group_rows // (share.stop - share.start))
    self.pages = host_memory.Pages((rule.slots - self.first, size, size, 3))
    self.images = self.pages.array
    self.labels = np.zeros((rule.slots - self.first,), np.int32)
    self._threads = concurrent.futures.ThreadPoolExecutor(COPY_THREADS)
    self._writes = concurrent.futures.ThreadPoolExecutor(WRITE_THREADS)
    self._writing = collections.deque()  # the writes' futures of the puts not known to be written, oldest first
    self._draws = concurrent.futures.ThreadPoolExecutor(1)
    self._buffers = host_memory.Buffers(rows.mesh.devices.flat[0], (size, size, 3))
    self._join = {}  # chunks → the devices' join of a put's image chunks
    self._split = {}  # (batches, the arrays' ranks) → the devices' split of a put's arrays into its batches
    # copying rows here; waiting for a buffer to be free, for the cache's writes; putting the pixels, the rest;
    # (tiered) the devices' assembly
    self.seconds = dict(copy=0.0, wait=0.0, written=0.0, place=0.0, draws=0.0)

  def put(self, batches: list[dict]):
    per_block = self.rule.batch_size // self.rule.blocks
    for batch in batches:
      _decoded_per_block(batch, self.rule)
      check_batch(batch, self.size, self.image_size)
    sent = [np.arange(len(batch["label"])) % per_block for batch in batches]
    draws = [{key: batch[key] for key in ("offset", "flip", "shift")} for batch in batches]
    images, on_device, chunks = self._gathered(batches, sent, per_block, draws)
    on_device = dict(image=self._placed(images, chunks), **on_device)
    if len(batches) == 1:
      return lambda: [(on_device, 0)]
    key = len(batches), tuple((k, v.ndim) for k, v in on_device.items())
    if key not in self._split:
      self._split[key] = _split(self.rows, *key)
    return lambda: [(b, 0) for b in self._split[key](on_device)]

  def _gathered(self, batches: list[dict], sent: list[np.ndarray], width: int,
                draws: list[dict]) -> tuple[np.ndarray, dict, int]:
    """(buffer, arrays on the mesh, chunks) of consecutive `batches`: the rows that their `sent` gives a place among
    their block's `width` (−1: not sent) copied into a buffer of `width` rows a block and batch (each block's rows of
    each batch in turn), held chunk-major in `chunks` parts (_chunk_major), the decoded ones from the batches and the
    cached ones from this cache; `draws` and the batches' labels, this cache's filled in, placed on the mesh in the
    same order while the rows are copied. Where a step writes, the decoded rows with slots here go into the cache
    behind the feed, by threads of their own (_write): in the first epoch they are up to as many bytes again as the
    batch's own, and the feed's copies bound it (docs/data.md). A batch that reads the cache waits for them first: it
    may read an image that an earlier row of it, or an earlier batch, decoded; a later one rewrites an image only
    with its same pixels."""
    per_block = self.rule.batch_size // self.rule.blocks
    n, group = len(batches[0]["label"]), len(batches)
    total = n // per_block * group * width
    start = time.perf_counter()
    images = self._buffers.take(total, self.group * n)
    self.seconds["wait"] += time.perf_counter() - start
    chunks = 1 if self._buffers.mapped else math.gcd(group * width, COPY_THREADS)
    order = _chunk_major(total, group * width, chunks)  # each sent row's place in the buffer, by its place in turn
    writes, copies, here_at, here_slot, placed = [], [], [], [], []
    for g, (batch, rows_sent, batch_draws) in enumerate(zip(batches, sent, draws, strict=True)):
      places, indices = batch["decoded"], batch["index"]
      k = _decoded_per_block(batch, self.rule)
      decoded = np.flatnonzero(places >= 0)
      host_rows = decoded // per_block * k + places[decoded]  # in batch['image']
      slot = indices - self.first  # in this cache
      if self.rule.writes(self.step + g):
        into = (slot[decoded] >= 0) & (indices[decoded] < self.rule.slots)
        writes.append((self.images, slot[decoded][into], batch["image"], host_rows[into]))
        self.labels[slot[decoded][into]] = batch["label"][decoded][into]
      here = np.flatnonzero((places < 0) & (rows_sent >= 0))  # the cached rows that this cache gives
      at = order[np.arange(n) // per_block * (group * width) + g * width + np.maximum(rows_sent, 0)]
      labels = batch["label"].copy()
      labels[here] = self.labels[slot[here]]
      copies.append((images, at[decoded], batch["image"], host_rows))
      here_at.append(at[here])
      here_slot.append(slot[here])
      placed.append(dict(batch_draws, label=labels))
    self.step += group
    if writes:
      self._write(writes)
    here_at, here_slot = np.concatenate(here_at), np.concatenate(here_slot)
    if len(here_slot):
      self._written()
    # The small arrays' puts beside the copy, which lets go of the GIL.
    placing = self._draws.submit(self._put_draws, _in_turn(placed, per_block))
    self._copy_rows(copies + [(images, here_at, self.images, here_slot)])
    return images, placing.result(), chunks

  def _write(self, writes: list[tuple]) -> None:
    """`writes` (as _copy_rows' copies) started on the write threads; the oldest put's waited for beyond
    WRITES_AHEAD."""
    self._writing.append([self._writes.submit(_copy, *part) for part in _parts(writes, WRITE_THREADS)])
    if len(self._writing) > WRITES_AHEAD:
      self._written(1)

  def _written(self, puts: int | None = None) -> None:
    """Waits for the writes of the oldest `puts` puts, of all by default."""
    start = time.perf_counter()
    for _ in range(len(self._writing) if puts is None else puts):
      for future in self._writing.popleft():
        future.result()
    self.seconds["written"] += time.perf_counter() - start

  def _placed(self, images: np.ndarray, chunks: int):
    """The buffer's images on the mesh (_place); the buffer used again once they are."""
    start = time.perf_counter()
    placed = self._place(images, chunks)
    self._buffers.placed(placed)
    self.seconds["place"] += time.perf_counter() - start
    return placed

  def _put_draws(self, batch: dict) -> dict:
    """The batch's arrays but its pixels on the mesh."""
    start = time.perf_counter()
    on_device = self.rows.put(batch)
    self.seconds["draws"] += time.perf_counter() - start
    return on_device

  def _place(self, images: np.ndarray, chunks: int):
    """The batch's images on the mesh from their `chunks` parts (the buffer holds them chunk-major), each put by a
    copy thread, all at once, then joined on the devices: threads put pageable memory on a GPU several times
    faster together than one alone (docs/BENCHMARKS.md). A buffer mapped for DMA goes whole: one copy, which the
    devices make while the host goes on."""
    sharding = self.rows.sharding(4)
    if chunks == 1:
      return jax.make_array_from_process_local_data(sharding, images)
    puts = [self._threads.submit(jax.make_array_from_process_local_data, sharding, part)
            for part in np.split(images, chunks)]
    if chunks not in self._join:
      self._join[chunks] = _joined(self.rows)
    return self._join[chunks](*(put.result() for put in puts))

  def _copy_rows(self, copies: list[tuple]) -> None:
    """dst[d] = src[s] for each (dst, dst rows, src, src rows) of `copies` over COPY_THREADS threads (_copy)."""
    start = time.perf_counter()
    for future in [self._threads.submit(_copy, *part) for part in _parts(copies, COPY_THREADS)]:
      future.result()
    self.seconds["copy"] += time.perf_counter() - start

  def close(self) -> None:
    self._writes.shutdown()
    self.pages.close()
    self._threads.shutdown()
    self._draws.shutdown()
    self._buffers.close()


class TieredCachedPut(HostCachedPut):
  """put(host batches under a tiered rule) → finish, as CachedPut: the rows the device tier does not hold (the
  decoded ones and the host tier's) assembled in this process's memory and placed as HostCachedPut places batches,
  K′ a block ('sent', the most of the put's batches), then the contract's batches assembled on the devices from them
  and the device tier, a block of its slots on each row block's devices, as CachedPut(sharded=True) does. The
  decoded rows with slots go into their tier while the rule writes. Batches must come in order from rule.start."""

  def __init__(self, rows: BatchLayout, size: int, image_size: int, rule: Schedule, group_rows: int = GROUP_ROWS):
    super().__init__(rows, size, image_size, rule, group_rows)
    held = dataclasses.replace(rule, slots=rule.device_slots, device_slots=0)
    self.devices = CachedPut(rows, size, image_size, held, sharded=True)
    self.seconds["assemble"] = 0.0

  def put(self, batches: list[dict]):
    per_block = self.rule.batch_size // self.rule.blocks
    sent, draws = [], []
    for batch in batches:
      _decoded_per_block(batch, self.rule)
      check_batch(batch, self.size, self.image_size)
      places, indices = batch["decoded"], batch["index"]
      rows = (places >= 0) | (indices >= self.first)
      counts = np.cumsum(rows.reshape(-1, per_block), axis=1)
      if counts[:, -1].max(initial=0) > int(batch["sent"]):
        raise ValueError(f"a tiered batch's row blocks send up to {counts[:, -1].max()} rows, more than its 'sent' "
                         f"{int(batch['sent'])}")
      sent.append(np.where(rows, counts.reshape(-1) - 1, -1).astype(np.int32))
      draws.append(dict(offset=batch["offset"], flip=batch["flip"], shift=batch["shift"], decoded=sent[-1],
                        index=indices))
    images, on_device, chunks = self._gathered(batches, sent, max(int(batch["sent"]) for batch in batches), draws)
    on_device["image"] = self._placed(images, chunks)

    def finish():
      start = time.perf_counter()
      assembled = self.devices.assemble(on_device, len(batches))
      self.seconds["assemble"] += time.perf_counter() - start
      return [(b, 0) for b in assembled]

    return finish


def _parts(copies: list[tuple], threads: int) -> list[tuple]:
  """`copies` (dst, dst rows, src, src rows) each cut into `threads` shares of their rows."""
  return [(dst, d, src, s) for dst, dst_rows, src, src_rows in copies
          for d, s in zip(np.array_split(dst_rows, threads), np.array_split(src_rows, threads)) if len(d)]


def _copy(dst: np.ndarray, dst_rows: np.ndarray, src: np.ndarray, src_rows: np.ndarray) -> None:
  """dst[dst_rows] = src[src_rows], cut into runs of consecutive destination rows (a whole share where the batch
  comes from one tier), each run one np.take into its place: that lets go of the GIL for the whole run and reads and
  writes each row once ('clip': with 'raise', numpy would gather into a temporary first). A loop row by row took the
  GIL back for every row (196 KB at 256×256), and waited for it while the feed's and the training loop's threads held
  it."""
  runs = np.flatnonzero(np.diff(dst_rows) != 1) + 1
  for d, s in zip(np.split(dst_rows, runs), np.split(src_rows, runs)):
    np.take(src, s, axis=0, out=dst[d[0]:d[0] + len(d)], mode="clip")


def _chunk_major(n: int, per_block: int, chunks: int) -> np.ndarray:
  """Where each of a process's n rows (blocks of per_block rows) lies in a buffer that holds them chunk-major: chunk c
  is the c-th of each block's `chunks` equal parts, block after block, and so a share of the batch as the mesh
  splits it."""
  local_blocks, part = n // per_block, per_block // chunks
  r = np.arange(n)
  block, offset = r // per_block, r % per_block
  return (offset // part) * (local_blocks * part) + block * part + offset % part


def _joined(rows: BatchLayout):
  """jit(chunks → the batch's images): the devices' inverse of _chunk_major, each on its own rows."""
  def join(*chunks):
    parts = [c.reshape(rows.blocks, -1, *c.shape[1:]) for c in chunks]  # (blocks, rows of a part, …)
    return jnp.stack(parts, axis=1).reshape(-1, *chunks[0].shape[1:])

  return jax.jit(join, out_shardings=rows.sharding(4))


def cached_put(kind: str, rows: BatchLayout, size: int, image_size: int, rule: Schedule,
               group_rows: int = GROUP_ROWS) -> HostPut:
  """The put of config.dataset.cache `kind`: 'device', 'sharded', 'host' or 'tiered' (which is 'sharded' where the
  devices take every slot, 'host' where they take none)."""
  if rule.tiered:
    return TieredCachedPut(rows, size, image_size, rule, group_rows)
  if kind == "host" or (kind == "tiered" and not rule.device_slots):
    return HostCachedPut(rows, size, image_size, rule, group_rows)
  return CachedPut(rows, size, image_size, rule, sharded=kind in ("sharded", "tiered"))


def _decoded_per_block(batch: dict, rule: Schedule) -> int:
  """K of a host batch under the cache (each of this process's row blocks holds K decoded rows), its 'decoded' and
  'index' checked against it."""
  n = len(batch["label"])
  k = len(batch["image"]) * rule.batch_size // (n * rule.blocks)
  if batch["decoded"].shape != (n,) or batch["index"].shape != (n,) or batch["decoded"].max(initial=-1) >= k:
    raise ValueError(f"a cached batch's 'decoded' and 'index' must be ({n},) with places below {k}")
  return k


def _in_turn(batches: list[dict], per_block: int) -> dict:
  """The arrays of consecutive batches (this process's rows of each) as one batch's: each row block's rows of each
  batch in turn, so that each block's devices take theirs of every batch (_split)."""
  def joined(arrays):
    stacked = np.stack(arrays)  # (batches, rows, …)
    blocks = stacked.reshape(len(arrays), -1, per_block, *stacked.shape[2:]).swapaxes(0, 1)
    return blocks.reshape(-1, *stacked.shape[2:])

  return {key: joined([b[key] for b in batches]) for key in batches[0]}


def _by_batch(arrays: dict, group: int) -> dict:
  """Within shard_map, a device's rows of `group` batches placed in turn (_in_turn) → (group, its rows of each, …)."""
  return {k: v.reshape(group, -1, *v.shape[1:]) for k, v in arrays.items()}


def _batches(stacked: dict, group: int) -> list[dict]:
  """(group, rows, …) arrays → the group's batches."""
  return [{k: v[g] for k, v in stacked.items()} for g in range(group)]


def _batch_shardings(rows: BatchLayout, ranks: dict, group: int) -> list[dict]:
  """The shardings of `group` batches of arrays of `ranks` ({key: rank}) placed as HostPut places one."""
  return [{k: rows.sharding(r) for k, r in ranks.items()} for _ in range(group)]


def _in_order(batches: list[dict], ranks: dict) -> list[dict]:
  """`batches` with their keys in the contract's order, 'image' first and 'label' last (pipeline.py), which a jitted
  function's dicts (keys sorted) lose."""
  keys = ["image", *(k for k in ranks if k not in ("image", "label")), "label"]
  return [{k: b[k] for k in keys} for b in batches]


def _split(rows: BatchLayout, group: int, ranks: tuple):
  """(arrays of `group` batches placed in turn (_in_turn) → the batches), jitted: each device splits its own rows."""
  axes = rows.axes
  mapped = jax.shard_map(functools.partial(_by_batch, group=group), mesh=rows.mesh, in_specs=P(axes),
                         out_specs=P(None, axes))
  split = jax.jit(lambda arrays: _batches(mapped(arrays), group),
                  out_shardings=_batch_shardings(rows, dict(ranks), group))
  return lambda arrays: _in_order(split(arrays), dict(ranks))


def _assembly(rows: BatchLayout, slots: int, writes: tuple[bool, ...], ranks: dict, sharded: bool = False):
  """The jitted (cache images, cache labels, the placed arrays of len(writes) consecutive batches in turn
  (_in_turn): 'image' their decoded rows, K a block each; 'decoded' a row's place among them or −1 where the cache
  gives it, 'index', 'label', the draws) → (cache images, cache labels, the batches), each device on its own rows,
  batch after batch; `writes`: whether each batch's decoded rows with slots go into the cache; `sharded`: each row
  block's devices hold their block of the slots (CachedPut); `ranks`: the placed arrays' ranks."""
  axes, group, write = rows.axes, len(writes), any(writes)

  def assemble(images, labels, decoded, places, indices, host_labels, writing):
    hit = places < 0
    from_host = decoded[jnp.maximum(places, 0)]
    first = lax.axis_index(axes) * len(images) if sharded else 0  # the slots here: [first, first + len(images))

    def here(slot):  # where slot lies in this device's images, len(images) (out of range) if elsewhere
      inside = (slot >= first) & (slot < first + len(images)) & (slot < slots)
      return jnp.where(inside, slot - first, len(images))

    if write:  # first: a batch may read an image that an earlier row of it decoded (the fill's last epoch's)
      into = jnp.where(~hit & writing, indices, slots)
      # every device writes every row block's images that it holds: gathered over the row axes
      written = [lax.all_gather(x, axes, tiled=True) for x in (into, from_host, host_labels)]
      images = images.at[here(written[0])].set(written[1], mode="drop")
      labels = labels.at[here(written[0])].set(written[2], mode="drop")
    if sharded:  # the whole batch's cached rows that lie here, then each device's rows summed from their owners
      wanted = [lax.all_gather(x, axes, tiled=True) for x in (jnp.where(hit, indices, slots), hit)]
      local = here(wanted[0])
      mine = local < len(images)
      local = jnp.where(mine, local, 0)
      cached = [lax.psum_scatter(jnp.where(mine.reshape(-1, *(1,) * (x.ndim - 1)), x[local], 0), axes,
                                 scatter_dimension=0, tiled=True) for x in (images, labels)]
    else:
      slot = jnp.where(hit, indices, 0)
      cached = [images[slot], labels[slot]]
    batch_images = jnp.where(hit[:, None, None, None], cached[0], from_host)
    return images, labels, batch_images, jnp.where(hit, cached[1], host_labels)

  def assemble_all(images, labels, placed):
    placed = _by_batch(placed, group)

    def step(cache, x):
      images, labels, batch_images, batch_labels = assemble(*cache, x["image"], x["decoded"], x["index"],
                                                            x["label"], x["writing"])
      return (images, labels), (batch_images, batch_labels)

    (images, labels), (batch_images, batch_labels) = lax.scan(
        step, (images, labels), dict(placed, writing=jnp.array(writes)))
    draws = {k: v for k, v in placed.items() if k not in ("image", "decoded", "index", "label")}
    return images, labels, dict(image=batch_images, **draws, label=batch_labels)

  # Unsharded, the cache's copies stay equal (every device writes the gathered rows), which JAX's check cannot see:
  # all_gather's result counts as varying over the axes it gathered.
  held = P(axes) if sharded else P()
  mapped = jax.shard_map(assemble_all, mesh=rows.mesh, in_specs=(held, held, P(axes)),
                         out_specs=(held, held, P(None, axes)), check_vma=False)
  cache_sharding = NamedSharding(rows.mesh, held)  # and the batches placed exactly as HostPut places one
  out = {k: r for k, r in ranks.items() if k not in ("decoded", "index")}

  def run(images, labels, placed):
    images, labels, stacked = mapped(images, labels, placed)
    return images, labels, _batches(stacked, group)

  jitted = jax.jit(run, donate_argnums=(0, 1),
                   out_shardings=(cache_sharding, cache_sharding, _batch_shardings(rows, out, group)))

  def assembled(images, labels, placed):
    images, labels, batches = jitted(images, labels, placed)
    return images, labels, _in_order(batches, out)

  return assembled


def slots(limit: int, num_train: int, size: int, mesh, step_bytes: int, shards: int = 1) -> int:
  """How many training images the cache holds: `limit` bytes' worth on each device (config.dataset.cache_bytes), or
  (0) what the devices' memory leaves beside the step's `step_bytes` and MARGIN, times the `shards` among which the
  sharded cache is split; at most num_train. The same on every process."""
  if not limit:
    free = [_free_bytes(d) for d in mesh.devices.flat if d.process_index == jax.process_index()]
    if None in free:
      raise DataError(f"these {mesh.devices.flat[0].platform} devices do not report their memory: set "
                      "config.dataset.cache_bytes to the bytes the cache may take on each")
    limit = max(0, min(free) - step_bytes - MARGIN)
  return _held(limit, num_train, size, shards)


HOST_SHARE = 0.75  # of the host memory available when a run starts: the rest for the workers, batches and the step


def host_slots(limit: int, num_train: int, size: int) -> int:
  """How many training images the host cache holds in this process: `limit` bytes' worth
  (config.dataset.cache_bytes), or (0) HOST_SHARE of the memory the host has available; at most num_train. The
  same on every process."""
  if not limit:
    limit = int(HOST_SHARE * os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
  return _held(limit, num_train, size)


def _held(limit: int, num_train: int, size: int, shards: int = 1) -> int:
  """`limit` bytes' worth of images on each of `shards`, at most num_train: the fewest any process can hold, so
  that all hold the same."""
  held = min(num_train, limit // image_bytes(size) * shards)
  return int(np.min(multihost_utils.process_allgather(np.int64(held)))) if jax.process_count() > 1 else int(held)


def _free_bytes(device) -> int | None:
  stats = device.memory_stats() or {}
  if "bytes_limit" not in stats:
    return None
  return stats["bytes_limit"] - stats.get("bytes_in_use", 0)

