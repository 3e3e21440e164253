"""Chooses the kernels' launch parameters by timing them on the GPU: the conv kernels' tiles per layer (`TUNED` in
triton_kernels/conv_tiles.py), and for the LRN and pool kernels, which launch by a rule, how far each layer is from
the best of a grid of launches (what the rules' constants are to be checked against on another GPU or network).

  python scripts/dev/tune_kernels.py --config configs/alexnet_2gpu.py [--batch 512] [--dtype bfloat16] [--workers 8]
      [--kernels fwd,dgrad,wgrad,lrn_fwd,lrn_bwd,pool_fwd,pool_bwd,lrn_pool_fwd,lrn_pool_bwd] [--layers conv1,lrn1]
      [--placements split,one] [--wgrad_columns 8192,16384] [--min_tile 16384] [--json OUT.json]

Every conv, LRN and pool layer of the config's network as a device runs it (`split`: one tower a device; `one`: every
tower on one device), once per distinct key. Each candidate (the rule's first) is compiled, checked against the
rule's result (max error ≤ 2^-6 of its largest element, else refused) and timed: --calls calls chained in one
compiled program (`chained`), the median of --rounds rounds. Workers compile in parallel; the timings start once
every worker has compiled all its candidates, one at a time on the GPU; the candidates that ran out of the GPU's
memory beside the other workers (each keeps what its largest candidate took) are timed again by one worker alone
once the others are done. Prints per key the rule's time, the table's, the best and its parameters, then the
`TUNED` entries to paste (those that beat the tiles launched now by more than KEEP) and the others; writes every
candidate's row as JSON as it comes (a run cut short keeps what it measured).
`--mode interpret` runs the same on a CPU under the Triton interpreter: the plumbing, not times.
"""

import json
import math
import multiprocessing
import os
import statistics
import sys
import time

from absl import flags

from alexnet_jax import cli
from alexnet_jax.measure.kernel_shapes import (ConvShape, first_conv, grouped_convs, grouped_maps, pool_after,
                                               tower_convs, tower_maps)

cli.define_config("a configs/*.py file: its network (and image size)")
flags.DEFINE_integer("batch", 512, "images per device")
flags.DEFINE_string("dtype", "bfloat16", "the activations' dtype: the table is for 16-bit ones")
CONV_KERNELS = ("fwd", "dgrad", "wgrad")
MAP_KERNELS = ("lrn_fwd", "lrn_bwd", "pool_fwd", "pool_bwd", "lrn_pool_fwd", "lrn_pool_bwd")
flags.DEFINE_list("kernels", [*CONV_KERNELS, *MAP_KERNELS], "which kernels")
flags.DEFINE_list("layers", [], "which conv, LRN and pool layers (default: all)")
flags.DEFINE_list("placements", ["split", "one"], "split: a tower per device; one: every tower on one device")
flags.DEFINE_integer("workers", 8, "processes compiling candidates in parallel")
flags.DEFINE_list("wgrad_columns", [], "filter gradient: reduction columns per program to try beside the rule's "
                  "(e.g. 8192,16384)")
flags.DEFINE_integer("min_tile", 0, "conv tiles of at least this many output elements (rows × cols) only: e.g. "
                     "16384 for layers whose outputs fill the GPU many times over, as VGG's do")
flags.DEFINE_integer("max_candidates", 0, "try only the first N candidates of each kernel (0: all)")
flags.DEFINE_integer("calls", 20, "calls timed back to back per round")
flags.DEFINE_integer("rounds", 5, "rounds; the median counts")
flags.DEFINE_enum("mode", "triton", ["triton", "interpret"], "interpret: the Triton interpreter (CPU, no timing)")
flags.DEFINE_string("json", None, "write every candidate's row here")

MAX_ERROR = 2.0 ** -6
KEEP = 0.03  # a tuned conv entry replaces the launched tiles only where it is faster by more than this
OUT_OF_MEMORY = "out of the GPU's memory"


def candidates(kernel: str, shape: ConvShape, wgrad_columns=(), min_tile=0):
  """Tiles worth timing, the rule of thumb first: output tiles of 32–256 rows by 32–256 columns (no larger than the
  layer's rows need, and of at least `min_tile` elements), reduction steps of 32 or 64, 3 or 4 pipeline stages, 8
  warps for the 128×256 tiles and both 4 and 8 for 128×128. Hopper's tensor cores (wgmma) want 64-row multiples per
  warp group. The filter gradient's tiles also with each of `wgrad_columns` reduction columns per program (fewer
  float32 partial sums for the caller to add up, and fewer programs), beside the rule's."""
  from triton_kernels import conv  # noqa: PLC0415  (Triton reads TRITON_INTERPRET when first imported)

  args = (shape.x, shape.w, shape.stride, shape.padding, shape.groups)
  first = conv.rule_of_thumb(kernel, *args)
  cg, kh, kw, f = shape.w
  rows_needed = {"fwd": f // shape.groups, "dgrad": cg, "wgrad": cg * kh * kw}[kernel]
  cols_needed = f // shape.groups if kernel == "wgrad" else 1 << 30
  out = [first]
  for rows in (32, 64, 128, 256):
    for cols in (32, 64, 128, 256):
      if rows > max(32, 2 * rows_needed - 1) or cols > max(32, 2 * cols_needed - 1) or rows * cols > 128 * 256:
        continue
      if rows * cols < max(64 * 64, min_tile) or (kernel != "wgrad" and cols < 64):
        continue
      for depth in (32, 64):
        for stages in (3, 4):
          warps = (4, 8) if rows * cols == 128 * 128 else (8,) if rows * cols > 128 * 128 else (4,)
          for w in warps:
            for columns in (first.columns, *wgrad_columns) if kernel == "wgrad" else (first.columns,):
              t = conv.Tiles(rows, cols, depth, w, stages, columns)
              if t not in out:
                out.append(t)
  return out


def device_convs(table, image_size: int, batch: int, placements) -> list[tuple[str, ConvShape]]:
  convs = []
  if "split" in placements and table.towers > 1:
    convs += [("split", s) for s in tower_convs(table, image_size, batch)]  # one tower's layer: groups 1
  if "one" in placements:
    convs += [("one", s) for s in grouped_convs(table, image_size, batch)]
  return convs


def map_candidates(kernel: str, group_channels: int):
  """Launches worth timing, the rule first (no overrides), as (name, value) pairs of the launch function's keywords:
  LRN 256–2048 positions per program × 1–6 chunks of each group's channels (an LRN and its pool as one: 128–1024
  pooled outputs or positions) × the walk's loop unrolled 1, 2 or 4 channels a pass; pool 1–16 elements per thread
  × 2, 4 or 8 warps."""
  if kernel.startswith("lrn"):
    blocks = (128, 256, 512, 1024) if kernel.startswith("lrn_pool") else (256, 512, 1024, 2048)
    grid = [(("block", b), ("chunks", c), ("unroll", u)) for b in blocks for c in (1, 2, 3, 4, 6) for u in (1, 2, 4)
            if c <= group_channels]
  else:
    grid = [(("per_thread", p), ("num_warps", w)) for p in (1, 2, 4, 8, 16) for w in (2, 4, 8)]
  return [(), *grid]


def device_maps(table, image_size: int, batch: int, placements) -> list[tuple[str, object, tuple, int]]:
  """(placement, layer, input shape, groups) of each LRN and pool as a device runs it: one tower's maps (split), or
  every tower's side by side (one)."""
  maps = []
  if "split" in placements and table.towers > 1:
    maps += [("split", layer, shape, 1) for layer, shape in tower_maps(table, image_size, batch).values()]
  if "one" in placements:
    maps += [("one", *m) for m in grouped_maps(table, image_size, batch).values()]
  return maps


def jobs_for(table, image_size, args):
  """[(kernel, key, [(placement, layer)], shape, tiles)] in a stable order, one per distinct key and candidate."""
  from triton_kernels import conv  # noqa: PLC0415

  pools, first = pool_after(table), first_conv(table)
  found = {}
  for placement, s in device_convs(table, image_size, args.batch, args.placements):
    if args.layers and s.name not in args.layers:
      continue
    for kernel in (k for k in args.kernels if k in CONV_KERNELS):
      if kernel == "dgrad" and s.name == first:
        continue
      key = conv.tile_key(kernel, s.x, s.w, s.stride, s.padding, s.groups)
      found.setdefault(key, (kernel, s, []))[2].append(f"{s.name} {placement}")
  for placement, layer, shape, groups in device_maps(table, image_size, args.batch, args.placements):
    if args.layers and layer.name not in args.layers:
      continue
    for kernel in (k for k in args.kernels if k.split("_")[0] == layer.kind):
      fused = kernel.startswith("lrn_pool")  # an LRN and the pool after it, as the network runs them
      if fused and layer.name not in pools:
        continue
      key = (kernel, *shape, groups)
      job = (layer, shape, groups, pools[layer.name] if fused else None)
      found.setdefault(key, (kernel, job, []))[2].append(f"{layer.name} {placement}")
  jobs = []
  for key, (kernel, s, names) in found.items():
    tiles = (candidates(kernel, s, tuple(map(int, args.wgrad_columns)), args.min_tile) if kernel in CONV_KERNELS
             else map_candidates(kernel, s[1][0] // s[2]))
    for i, t in enumerate(tiles[:args.max_candidates or None]):
      jobs.append(dict(kernel=kernel, key=key, layers=names, shape=s, tiles=t, rule=i == 0))
  return jobs


def _map_function(kernel, dtype, mode, options, layer, shape, groups, pool):
  """(function, a maker of its random operands, bytes it moves) of one LRN or pool kernel (or of an LRN and its
  `pool` as one) with launch overrides `options`."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  from alexnet_jax.ops.lrn import LRN_BWD, LRN_FWD  # noqa: PLC0415
  from alexnet_jax.ops.lrn_pool import LRN_POOL_BWD, LRN_POOL_FWD  # noqa: PLC0415
  from alexnet_jax.ops.pool import POOL_BWD, POOL_FWD  # noqa: PLC0415
  from triton_kernels.pool import pooled_shape  # noqa: PLC0415

  kx, kd = jax.random.split(jax.random.key(0))
  itemsize = jnp.dtype(dtype).itemsize
  size = math.prod(shape) * itemsize

  def x():
    return (jax.random.normal(kx, shape) * 30).astype(dtype)  # large enough to be normalised

  def pooled(window, stride):
    """A maker of a pool's dy and int8 choices, and the bytes they (or y and the choices) move."""
    p_shape = pooled_shape(shape, window, stride)

    def make():
      return (jax.random.normal(kd, p_shape, dtype),
              jax.random.randint(kd, p_shape, 0, window * window).astype(jnp.int8))

    return make, math.prod(p_shape) * (itemsize + 1)

  if kernel.startswith("lrn"):  # with the ReLU of the conv before it, as AlexNet's LRNs run
    params = dict(mode=mode, groups=groups, n=layer.size, k=layer.k, alpha=layer.alpha, beta=layer.beta, relu=True,
                  launch=options)
  if kernel.startswith("lrn_pool"):
    params.update(size=pool.size, stride=pool.stride)
    dy_idx, moved = pooled(pool.size, pool.stride)
    if kernel == "lrn_pool_fwd":
      return jax.jit(lambda x: LRN_POOL_FWD(x, **params)[0]), lambda: (x(),), size + moved
    return (jax.jit(lambda x, dy, idx: LRN_POOL_BWD(x, dy, idx, **params)[0]), lambda: (x(), *dy_idx()),
            2 * size + moved)
  if kernel == "lrn_fwd":
    return jax.jit(lambda x: LRN_FWD(x, **params)[0]), lambda: (x(),), 2 * size
  if kernel == "lrn_bwd":
    return (jax.jit(lambda x, dy: LRN_BWD(x, dy, **params)[0]),
            lambda: (x(), jax.random.normal(kd, shape, dtype)), 3 * size)
  params = dict(mode=mode, size=layer.size, stride=layer.stride, launch=options)
  dy_idx, moved = pooled(layer.size, layer.stride)
  if kernel == "pool_fwd":
    return jax.jit(lambda x: POOL_FWD(x, **params)[0]), lambda: (x(),), size + moved
  return (jax.jit(lambda dy, idx: POOL_BWD(dy, idx, height=shape[1], width=shape[2], **params)[0]), dy_idx,
          size + moved)


def chained(fn, calls: int, touch: int):
  """`(*operands) -> (fn's last output, operands[touch])`, jitted: fn called `calls` times in one program, the
  operand `touch` (one the kernel reads) with one element changed by the call before, in place (it is donated, and
  comes back for the next round): XLA can neither merge the calls nor hoist them out, each call's whole output is
  made (an optimisation barrier), and no dispatch from the host stands between two kernels. Called once a call from
  the host, a kernel shorter than its dispatch would be timed by the dispatch, as a small layer's are; here each call
  adds one one-element kernel to the kernel's own."""
  import jax  # noqa: PLC0415
  from jax import lax  # noqa: PLC0415

  def run(*operands):
    operands, out = list(operands), None
    for _ in range(calls):
      if out is not None:  # adds 0 (the previous output is finite), which XLA cannot know
        x = operands[touch]
        corner = (0,) * x.ndim
        bump = lax.is_finite(lax.optimization_barrier(out).reshape(-1)[0]).astype(x.dtype) - 1
        operands[touch] = lax.dynamic_update_slice(x, lax.slice(x, corner, (1,) * x.ndim) + bump, corner)
      out = fn(*operands)
    return out, operands[touch]

  return jax.jit(run, donate_argnums=touch)


def _worker(jobs, results, lock, compiled_all, dtype, mode, calls, rounds):
  os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # many processes share the GPU
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415

  from alexnet_jax.ops import conv as ops_conv  # noqa: PLC0415
  from alexnet_jax.ops.backend import dot_precision  # noqa: PLC0415
  from triton_kernels import conv  # noqa: PLC0415

  def conv_function(kernel, s: ConvShape, tiles):
    """(function, a maker of its random operands, FLOPs) of one conv kernel with `tiles`."""
    geometry = dict(mode=mode, stride=s.stride, padding=s.padding, groups=s.groups, precision=dot_precision(dtype),
                    tiles=tiles)
    kx, kw, kb, kd = jax.random.split(jax.random.key(0), 4)
    y_shape = jax.eval_shape(lambda x, w: ops_conv.conv2d_reference(x, w, stride=s.stride, padding=s.padding,
                                                                    groups=s.groups),
                             jax.ShapeDtypeStruct(s.x, dtype), jax.ShapeDtypeStruct(s.w, dtype)).shape

    def operands():
      return (jax.random.normal(kx, s.x, dtype), (jax.random.normal(kw, s.w) * 0.05).astype(dtype),
              jax.random.normal(kb, (s.w[3],), jnp.float32), jax.random.normal(kd, y_shape, dtype))

    if kernel == "fwd":
      fn = lambda x, w, b, dy: ops_conv.CONV_FWD(x, w, b, relu=False, has_bias=True, **geometry)[0]  # noqa: E731
    elif kernel == "dgrad":
      fn = lambda x, w, b, dy: ops_conv.CONV_DGRAD(dy, w, x_shape=s.x, **geometry)[0]  # noqa: E731
    else:
      fn = lambda x, w, b, dy: ops_conv.CONV_WGRAD(x, dy, w_shape=s.w, bias=True, **geometry)[0]  # noqa: E731
    return jax.jit(fn), operands, s.flops

  def function(kernel, s, tiles):
    if kernel in CONV_KERNELS:
      return conv_function(kernel, s, tiles)
    return _map_function(kernel, dtype, mode, tiles, *s)

  def rule_of(kernel, s):
    return conv.rule_of_thumb(kernel, s.x, s.w, s.stride, s.padding, s.groups) if kernel in CONV_KERNELS else ()

  def error(ref, out):
    ref = ref.astype(jnp.float32)
    return jnp.abs(out.astype(jnp.float32) - ref).max() / jnp.abs(ref).max()

  # key -> what every candidate of a key shares, compiled: the rule's kernel (each candidate is checked against it),
  # the maker of the operands, the error against the rule, the copy of the operand the timed program donates.
  shared, compiled = {}, []
  for job in iter(jobs.get, None):
    kernel, s, tiles = job["kernel"], job["shape"], job["tiles"]
    row = dict(kernel=kernel, key=list(job["key"]), layers=job["layers"], tiles=list(_fields(tiles)), rule=job["rule"])
    try:
      t0 = time.perf_counter()
      fn, make, work = function(kernel, s, tiles)
      touch = 3 if kernel == "dgrad" else 0  # an operand the kernel reads (conv_function's dgrad ignores x)
      specs = jax.eval_shape(make)  # compiled from shapes: the operands live only while the GPU is this worker's
      timed = chained(fn, calls, touch).lower(*specs).compile()
      fn = fn.lower(*specs).compile()
      row["compile_s"] = time.perf_counter() - t0
      if job["key"] not in shared:
        rule, _, _ = function(kernel, s, rule_of(kernel, s))
        out = jax.eval_shape(rule, *specs)
        shared[job["key"]] = (rule.lower(*specs).compile(), jax.jit(make).lower().compile(),
                              jax.jit(error).lower(out, out).compile(), jax.jit(jnp.copy).lower(specs[touch]).compile())
      row["compiled_at"] = time.time()  # wall clock: the workers' stamps compare across processes
      compiled.append((row, fn, timed, touch, work, shared[job["key"]]))
    except Exception as e:  # noqa: BLE001  (a candidate Triton cannot compile, e.g. too much shared memory)
      results.put(_refused(row, e))
  # A timing shares the machine with nothing: no other worker compiles, starts CUDA or loads its kernels beside it.
  compiled_all.wait()
  for row, fn, timed, touch, work, (rule, make, error_of, copy) in compiled:
    kernel = row["kernel"]
    try:
      with lock:
        row["timed_at"] = time.time()
        operands = make()
        row["error"] = float(error_of(rule(*operands), fn(*operands)))
        mine = list(operands)
        mine[touch] = copy(operands[touch])  # the timed program's own, donated round after round
        times = []
        for _ in range(rounds + 1):  # the first round warms up
          t0 = time.perf_counter()
          out, mine[touch] = timed(*mine)
          jax.block_until_ready(out)
          times.append((time.perf_counter() - t0) / calls)
        del out, mine, operands  # big layers fit many workers
      row["ms"] = statistics.median(times[1:]) * 1e3
      # conv kernels: TFLOP/s of the forward's multiply-adds; LRN and pool: TB/s of the bytes they move
      row["tflops" if kernel in CONV_KERNELS else "tbs"] = work / (row["ms"] * 1e-3) / 1e12
      if not row["error"] <= MAX_ERROR:
        row["refused"] = f"error {row['error']:.2e} > {MAX_ERROR:.2e} against the rule's result"
    except Exception as e:  # noqa: BLE001
      row = _refused(row, e)
    results.put(row)


def _refused(row: dict, e: Exception) -> dict:
  row["refused"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
  if "RESOURCE_EXHAUSTED" in str(e):  # each worker keeps the memory it once used: the rest may not fit
    row["refused"] = f"{OUT_OF_MEMORY}: {row['refused']}"
  return row


def _time_jobs(jobs, args, workers: int, report) -> None:
  """Times `jobs` in `workers` processes, passing each result row to `report` as it comes."""
  ctx = multiprocessing.get_context("spawn")
  queue, results, lock = ctx.Queue(), ctx.Queue(), ctx.Lock()
  compiled_all = ctx.Barrier(max(1, workers))
  for j in jobs:
    queue.put(j)
  processes = [ctx.Process(target=_worker, args=(queue, results, lock, compiled_all, args.dtype, args.mode,
                                                 args.calls, args.rounds))
               for _ in range(max(1, workers))]
  for p in processes:
    queue.put(None)
    p.start()
  for _ in jobs:
    report(results.get())
  for p in processes:
    p.join()


def _candidate(job_or_row) -> tuple:
  """(kernel, key, tiles as the rows hold them): a candidate, from its job or its row."""
  tiles = job_or_row["tiles"]
  tiles = _fields(tiles) if not isinstance(tiles, list) else tiles
  return job_or_row["kernel"], tuple(job_or_row["key"]), json.dumps(tiles)


def _fields(t):
  """A candidate as the JSON rows hold it: a conv Tiles' fields, or an LRN or pool launch's (name, value) pairs."""
  if isinstance(t, tuple):
    return [list(pair) for pair in t]
  return (t.rows, t.cols, t.depth, t.num_warps, t.num_stages, t.columns)


def launched_tiles(key) -> tuple:
  """The tiles a 16-bit launch of a conv key takes now, as the rows hold tiles: its table entry, the entry it falls
  back to (another batch or group count of the layer), or the rule of thumb."""
  from triton_kernels import conv  # noqa: PLC0415

  kernel, n, cg, h, w, fg, kh, kw, stride, padding, g = key
  return tuple(_fields(conv.tiles_for(kernel, (cg * g, h, w, n), (cg, kh, kw, fg * g), stride, padding, g,
                                      "bfloat16")))


def beats_launched(b: dict) -> bool:
  """Whether a conv key's best (summarise) beat the tiles a launch takes now by more than KEEP, the timings' spread:
  the table takes an entry only then, so that a re-run's noise does not churn it."""
  return bool(b["table_ms"]) and b["best_ms"] < b["table_ms"] / (1 + KEEP)


def summarise(rows):
  """Per key: the rule's row, the best accepted row, and for a conv key the row of the tiles a launch takes now
  (`launched_tiles`); best_rate is TFLOP/s for conv kernels, TB/s for LRN and pool."""
  by_key = {}
  for r in rows:
    by_key.setdefault(tuple(r["key"]), []).append(r)
  out = []
  for key, rs in by_key.items():
    s = rs[0]
    rule = [r for r in rs if r.get("rule")]
    ok = [r for r in rs if "ms" in r and "refused" not in r]
    if not ok:
      continue
    best = min(ok, key=lambda r: r["ms"])
    table = launched_tiles(key) if s["kernel"] in CONV_KERNELS else None
    now = [r for r in ok if table is not None and tuple(r["tiles"]) == table]
    out.append(dict(kernel=s["kernel"], key=list(key), layers=s["layers"], best=best["tiles"], best_ms=best["ms"],
                    best_rate=best.get("tflops", best.get("tbs")), rule_ms=rule[0].get("ms") if rule else None,
                    table_ms=now[0]["ms"] if now else None, tried=len(rs), refused=len(rs) - len(ok)))
  return out


def main(argv):
  del argv
  args = flags.FLAGS
  if args.mode == "interpret" and os.environ.get("TRITON_INTERPRET") != "1":
    sys.exit("error: --mode interpret needs TRITON_INTERPRET=1 in the environment")
  if not all(c.isdigit() and int(c) > 0 for c in args.wgrad_columns):
    sys.exit(f"error: --wgrad_columns takes positive whole numbers of columns, got {','.join(args.wgrad_columns)}")
  from alexnet_jax.config import network_table  # noqa: PLC0415

  config = args.config
  table = network_table(config, config.dataset.num_classes or 1000)
  jobs = jobs_for(table, config.image_size, args)
  rows, t0 = [], time.perf_counter()

  def report(row):
    rows.append(row)
    print(f"[{len(rows)}/{len(jobs)} {time.perf_counter() - t0:.0f}s] {row['kernel']} {'/'.join(row['layers'])} "
          f"{row['tiles']}: " + (row["refused"][:120] if "refused" in row else f"{row['ms']:.3f} ms"), flush=True)
    if args.json:
      with open(args.json, "w") as f:
        json.dump(dict(dtype=args.dtype, batch=args.batch, mode=args.mode, rows=rows), f, indent=1)

  _time_jobs(jobs, args, args.workers, report)
  # Each worker keeps the memory its largest candidate took: on a smaller GPU the largest layers' candidates may not
  # fit beside the others. They are timed again by one worker, alone with the GPU's memory.
  crowded = {_candidate(r) for r in rows if r.get("refused", "").startswith(OUT_OF_MEMORY)}
  if crowded and args.workers > 1:
    print(f"{len(crowded)} candidates ran out of memory beside the other workers: timing them again in one worker",
          flush=True)
    rows[:] = [r for r in rows if _candidate(r) not in crowded]
    _time_jobs([j for j in jobs if _candidate(j) in crowded], args, 1, report)
  best = summarise(rows)
  print(f"\n{args.dtype}, batch {args.batch}; conv tiles: rows, cols, depth, warps, stages, wgrad columns per "
        "program; rate: TFLOP/s (conv), TB/s (LRN, pool)")
  print(f"{'kernel':12} {'layers':24} {'rule ms':>8} {'table ms':>8} {'best ms':>8} {'rate':>8} {'gain':>6}  best")
  for b in best:
    gain = b["rule_ms"] / b["best_ms"] if b["rule_ms"] else float("nan")
    table_ms = f"{b['table_ms']:8.3f}" if b["table_ms"] else f"{'':8}"
    rule_ms = f"{b['rule_ms']:8.3f}" if b["rule_ms"] else f"{'':8}"
    print(f"{b['kernel']:12} {', '.join(b['layers']):24} {rule_ms} {table_ms} {b['best_ms']:8.3f} "
          f"{b['best_rate']:8.2f} {gain:6.2f}  {b['best']}")
  convs = [b for b in best if b["kernel"] in CONV_KERNELS]
  margin = f"{100 * KEEP:g} %"
  kept = f"TUNED entries (triton_kernels/conv_tiles.py) that beat the tiles launched now by more than {margin}:"
  others = f"the others (within {margin} of the launched tiles, which then stay, or the launched tiles not timed):"
  for title, entries in ((kept, [b for b in convs if beats_launched(b)]),
                         (others, [b for b in convs if not beats_launched(b)])):
    if entries:
      print(f"\n{title}")
    for b in entries:
      launched = f", launched {b['table_ms']:.3f} ms" if b["table_ms"] else ""
      print(f"    {tuple(b['key'])}: {tuple(b['best'])},  # {', '.join(b['layers'])}: {b['best_ms']:.3f} ms{launched}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(dtype=args.dtype, batch=args.batch, mode=args.mode, rows=rows, best=best), f, indent=1)


if __name__ == "__main__":
  cli.run(main)
