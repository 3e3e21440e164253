"""scripts/benchmark.py, scripts/dev/profile_step.py and scripts/dev/bench_end_to_end.py end to end on the demo
config (tiny, CPU), and the reading of profiler traces."""

import json
import math
import os
import subprocess
import sys

import pytest

from alexnet_jax.measure import comm, kernel_times, systems
from alexnet_jax.network.table import alexnet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.width=0.0625", "--config.image_size=64"]  # the demo's layers, compiled in seconds


def script(name, *args, timeout=300, env=None):
  return subprocess.run([sys.executable, f"scripts/{name}", "--config", "configs/demo.py", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_benchmark_times_ours_against_plain_xla_in_one_table(tmp_path):
  out = tmp_path / "rows.json"
  cache = tmp_path / "cache"
  run = script("benchmark.py", *SMALL, "--systems=xla:split,plain:split,triton:one", "--dtypes=float32",
               "--batches=4", "--steps=1", "--windows=1", f"--json={out}", f"--compilation_cache={cache}",
               env=dict(NCCL_PROTO="Simple"))
  # triton:one cannot run on a CPU: its row says why, the others are timed, and the run ends with one error line.
  assert run.returncode != 0 and run.stderr.strip().splitlines()[-1] == "error: 1 of 3 runs failed (their rows say why)"
  rows = {r["system"]: r for r in json.loads(out.read_text())}
  assert "needs a CUDA GPU" in rows["triton:one"]["error"]
  ours, plain = rows["xla:split"], rows["plain:split"]
  for r in (ours, plain):
    assert r["devices"] == 2 and r["batch"] == 4 and r["images_per_s"] > 0 and r["step_ms"] > 0
    assert r["flops_per_image"] == systems.train_flops_per_image(alexnet(num_classes=10, width=0.0625), 64)
    assert 0 < r["mfu"] < 1e-3  # a CPU against an H200's peak
    assert r["settings"]["NCCL_PROTO"] == "Simple"  # what the row ran under, to compare calls
    assert {"conv3 all-gather", "fc6 all-gather", "fc7 all-gather", "fc8 all-reduce"} <= set(r["collective_bytes"])
  assert ours["collective_bytes"] == plain["collective_bytes"]  # the same network moves the same bytes
  assert ours["vs_plain"] == pytest.approx(ours["images_per_s"] / plain["images_per_s"])
  assert plain["vs_plain"] == 1.0
  table = run.stdout[run.stdout.index("system "):]
  assert "xla:split" in table and "plain:split" in table and "needs a CUDA GPU" in table
  assert "diverged" not in table  # the demo's learning rate trains
  assert len(list(cache.iterdir())) >= 2  # each timed row's step went into the shared compilation cache


def test_a_row_whose_loss_ends_not_finite_is_marked_diverged(tmp_path):
  # A learning rate of 1e6 blows the weights up within the warm-up steps: the row is timed and kept, and marked.
  out = tmp_path / "rows.json"
  run = script("benchmark.py", *SMALL, "--systems=plain:one", "--dtypes=float32", "--batches=4", "--steps=1",
               "--windows=1", "--noseparate", "--config.learning_rate=1e6", "--config.mesh.model=1",
               f"--json={out}")
  assert run.returncode == 0, run.stderr
  (row,) = json.loads(out.read_text())
  assert row["images_per_s"] > 0 and not math.isfinite(row["loss"])
  table = run.stdout[run.stdout.index("system "):]
  assert "diverged" in table.splitlines()[1]
  assert "diverged: the loss at the row's last timed step was not finite" in table


def test_benchmark_refuses_an_unknown_system_in_one_line():
  run = script("benchmark.py", "--systems=triton:ring", timeout=60)
  assert run.returncode != 0 and "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1].startswith("error: unknown system 'triton:ring'")
  run = script("benchmark.py", "--systems=torch:split", timeout=60)
  assert run.returncode != 0 and run.stderr.strip().splitlines()[-1] == (
      "error: system torch:split: the PyTorch step (measure/torch_step.py) runs on one GPU: torch:one")


def test_profile_step_tables_the_kernels_of_a_traced_step(tmp_path):
  out = tmp_path / "profile.json"
  run = script("dev/profile_step.py", *SMALL, "--config.batch_size=4", "--system=xla:split", "--steps=1",
               f"--json={out}", f"--trace_dir={tmp_path / 'trace'}")
  assert run.returncode == 0, run.stderr[-2000:]
  summary = json.loads(out.read_text())
  assert set(summary["devices"]) == {"CPU:0", "CPU:1"}
  d = summary["devices"]["CPU:0"]
  assert 0 < d["busy_ms"] <= d["wall_ms"]
  assert sum(g["ms"] for g in d["groups"]) == pytest.approx(d["kernel_ms"])
  layers = {(g["layer"], g["pass"]) for g in d["groups"]}
  assert {("conv1", "fwd"), ("conv3", "bwd"), ("fc8", "fwd")} <= layers
  assert d["by_kind"]["collective"] > 0
  assert "busy" in run.stdout and "conv3" in run.stdout


def test_gpu_trace_counts_stream_kernels_once_and_busy_as_their_union():
  meta = [dict(ph="M", pid=1, name="process_name", args=dict(name="/device:GPU:0")),
          dict(ph="M", pid=1, tid=7, name="thread_name", args=dict(name="Stream #13(Compute)")),
          dict(ph="M", pid=1, tid=8, name="thread_name", args=dict(name="XLA Ops")),
          dict(ph="M", pid=2, name="process_name", args=dict(name="/host:CPU")),
          dict(ph="M", pid=2, tid=9, name="thread_name", args=dict(name="python"))]
  kernels = [dict(ph="X", pid=1, tid=7, ts=0.0, dur=10.0, name="conv_fwd_kernel", args=dict(hlo_op="custom-call.1")),
             dict(ph="X", pid=1, tid=7, ts=20.0, dur=5.0, name="ncclDevKernel_AllGather", args={}),
             dict(ph="X", pid=1, tid=8, ts=0.0, dur=25.0, name="custom-call.1", args=dict(hlo_op="custom-call.1")),
             dict(ph="X", pid=2, tid=9, ts=0.0, dur=40.0, name="PjitFunction(train_step)", args={})]
  events = kernel_times.device_events(dict(traceEvents=meta + kernels))
  assert sorted(e.name for e in events) == ["conv_fwd_kernel", "ncclDevKernel_AllGather"]
  ops = kernel_times.hlo_ops(
      '  %custom-call.1 = (bf16[96,55,55,128]{3,2,1,0}) custom-call(bf16[3,224,224,128]{3,2,1,0} %p), '
      'custom_call_target="triton_kernel_call", '
      'metadata={op_name="jit(train_step)/jvp()/shard_map/Network/conv1/chwn_conv_fwd"}')
  d = kernel_times.summarise(events, ops, ["conv1", "conv3"], steps=1)["GPU:0"]
  assert d["busy_ms"] == pytest.approx(0.015) and d["wall_ms"] == pytest.approx(0.025)
  assert d["by_kind"] == pytest.approx({"triton kernel (ours)": 0.010, "collective": 0.005})
  assert (d["groups"][0]["layer"], d["groups"][0]["pass"]) == ("conv1", "fwd")


def test_benchmark_rows_of_the_strategies_lab(tmp_path):
  out = tmp_path / "rows.json"
  # (the hybrid's rows: tests/test_scaling.py)
  run = script("benchmark.py", *SMALL, "--systems=xla:dp,xla:pmap", "--dtypes=float32", "--batches=4",
               "--steps=1", "--windows=1", "--noseparate", f"--json={out}")
  assert run.returncode == 0, run.stderr[-2000:]
  rows = {r["system"]: r for r in json.loads(out.read_text())}
  assert all(r["devices"] == 2 and r["images_per_s"] > 0 for r in rows.values())
  assert rows["xla:pmap"]["loss"] == pytest.approx(rows["xla:dp"]["loss"], rel=1e-5)  # pmap computes dp's step
  # Gradients are labelled per layer, never as a '+'-joined group.
  names = {layer.name for layer in alexnet(num_classes=10, width=0.0625).layers} | set(comm.OUTSIDE.values())
  assert {k.split()[0] for k in rows["xla:dp"]["collective_bytes"]} <= names
  assert {"conv1 all-reduce", "fc8 all-reduce"} <= set(rows["xla:dp"]["collective_bytes"])


def test_bench_end_to_end_times_training_on_a_store_against_the_synthetic_step(tmp_path, monkeypatch):
  """On two CPU devices, a 24-photo store: the decoder alone and beside the step, then the host decoding in this
  process and the devices' processes decoding half of each batch, each row with where its time went."""
  monkeypatch.syspath_prepend(os.path.join(ROOT, "scripts", "dev"))
  import bench_input  # noqa: PLC0415  (scripts/dev/, not a package)

  bench_input.write_folder(str(tmp_path / "photos"), 24)
  prepare = subprocess.run([sys.executable, "scripts/prepare_data.py", "--name=folder",
                            f"--data_dir={tmp_path / 'photos'}", f"--store={tmp_path / 'store'}", "--size=72",
                            "--workers=1"],
                           cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert prepare.returncode == 0, prepare.stderr[-2000:]
  out = tmp_path / "end_to_end.json"
  run = script("dev/bench_end_to_end.py", *SMALL, "--config.dataset.resize=72", f"--store={tmp_path / 'store'}",
               "--config.batch_size=4", "--steps=2", "--settings=cpu:0:1,gpu:0:1:0.5", "--decoder_rows=all",
               "--decoder_seconds=0.5", "--cache=1,host:0.5,sharded:0.5", "--group_rows=8,0", f"--json={out}")
  assert run.returncode == 0, run.stderr[-2000:]
  result = json.loads(out.read_text())
  assert result["devices"] == 2 and result["batch"] == 4 and result["synthetic_images_per_s"] > 0
  (decoder,) = result["decoders"]
  assert decoder["backends"] == "all" and decoder["per_device"] == pytest.approx(decoder["images_per_s"] / 2)
  assert 0 < decoder["processes_busy"] <= 1.05 and decoder["images_per_s_beside_training"] > 0
  assert decoder["step_images_per_s_alone"] > 0 and decoder["step_images_per_s_beside"] > 0
  cpu, gpu = result["rows"]
  assert (cpu["decoder"], cpu["host_share"], cpu["decoding"]) == ("cpu", 0.0, {})
  assert gpu["decoder"] == "gpu" and gpu["host_share"] == 0.5
  assert set(gpu["decoding"]) == {"start", "wait", "collect", "decode"} and gpu["decoding"]["decode"] > 0
  for row in (cpu, gpu):
    assert row["images_per_s"] > 0 and row["host_images_per_s"] > 0
    assert row["of_synthetic"] == pytest.approx(row["images_per_s"] / result["synthetic_images_per_s"])
    # the thread's whole window, give or take the reads
    assert set(row["feed"]) == {"host", "put", "loop"} and 0.5 < sum(row["feed"].values()) < 2
  assert "of synthetic" in run.stdout
  # The device cache holding the whole store, then the host's holding half, its puts two batches (8 rows) and one: the
  # epochs after the first read them.
  full, half, one_a_put, sharded = result["cache"]
  assert (full["cache"], full["fraction"], half["cache"], half["fraction"]) == ("device", 1.0, "host", 0.5)
  assert (full["group"], half["group"], one_a_put["group"], sharded["group"]) == (1, 2, 1, 1)
  assert one_a_put["images"] == half["images"] and one_a_put["later_images_per_s"] > 0
  assert (sharded["cache"], sharded["images"]) == ("sharded", round(0.5 * full["images"]))
  assert half["images"] == round(full["images"] / 2) > 0
  assert full["later_images_per_s"] > 0 and half["later_images_per_s"] > 0
  # Six batches an epoch are fewer than the batches that can stand built ahead: a first epoch so short is not timed,
  # and the row says how large a store would be.
  assert all(row["first_epoch_images_per_s"] is None and row["first_put"] is None
             for row in (full, half, one_a_put, sharded))
  assert half["host_pages_s"] >= 0 and full["host_pages_s"] is None and sharded["host_pages_s"] is None
  assert "1: the first epoch is not timed" in run.stdout and "it needs a store of at least" in run.stdout
  assert all(set(row["later_feed"]) == {"host", "put", "loop"} for row in (full, half, one_a_put, sharded))
  assert sharded["later_images_per_s"] > 0
  assert half["model_images_per_s"] == pytest.approx(min(result["synthetic_images_per_s"],
                                                          2 * result["cache_host_images_per_s"]))
  assert "set config.dataset.cache_bytes" in result["imagenet_in_cache"]["error"]  # CPU devices: no memory figures


def test_bench_end_to_end_needs_a_store():
  run = script("dev/bench_end_to_end.py", timeout=60)
  assert run.returncode != 0 and "Traceback" not in run.stderr
  assert "--store" in run.stderr.strip().splitlines()[-1]


def test_tune_kernels_times_candidates_and_prints_table_entries(tmp_path):
  out = tmp_path / "tune.json"
  run = script("dev/tune_kernels.py", *SMALL, "--batch=2", "--dtype=float16", "--mode=interpret",
               "--layers=conv5,lrn2,pool5", "--kernels=fwd,lrn_bwd,pool_fwd,lrn_pool_bwd", "--placements=split,one",
               "--max_candidates=2", "--workers=2", "--calls=1", "--rounds=1", f"--json={out}")
  assert run.returncode == 0, run.stderr[-2000:]
  result = json.loads(out.read_text())
  # every candidate compiled, by either worker, before the first timing began
  assert max(r["compiled_at"] for r in result["rows"]) <= min(r["timed_at"] for r in result["rows"])
  rows = {}
  for r in result["rows"]:
    rows.setdefault(r["kernel"], []).append(r)
    assert "refused" not in r and r["ms"] > 0
  # conv5 split and grouped: the same layer per group, but two keys (the grouped grid is twice the split's), each its
  # rule of thumb and one other candidate
  assert sorted((r["layers"][0], r["key"][-1], r["rule"]) for r in rows["fwd"]) == [
      ("conv5 one", 2, False), ("conv5 one", 2, True), ("conv5 split", 1, False), ("conv5 split", 1, True)]
  for r in rows["fwd"]:
    assert len(r["layers"]) == 1 and r["key"][:2] == ["fwd", 2] and r["error"] <= 2.0 ** -6
  # an LRN or pool (or an LRN and its pool as one) tower apart and the towers side by side: two keys, each its rule
  # (no overrides) and one launch (an LRN's: block, chunks, unroll; a pool's: per_thread, num_warps), which computes
  # the very same numbers
  for kernel, layer, options in (("lrn_bwd", "lrn2", 3), ("pool_fwd", "pool5", 2), ("lrn_pool_bwd", "lrn2", 3)):
    assert sorted(r["layers"][0] for r in rows[kernel]) == [f"{layer} one"] * 2 + [f"{layer} split"] * 2
    assert sorted(len(r["tiles"]) for r in rows[kernel]) == [0, 0, options, options]
    assert all(r["error"] == 0 for r in rows[kernel])
  assert sorted((b["kernel"], b["tried"]) for b in result["best"]) == [("fwd", 2)] * 2 + [("lrn_bwd", 2)] * 2 + [
      ("lrn_pool_bwd", 2)] * 2 + [("pool_fwd", 2)] * 2
  # the entries to paste into conv_tiles.py, those that beat the launched tiles by more than 3 %, then the others
  # (the interpreter's times make either list empty or not)
  fwd = [b for b in result["best"] if b["kernel"] == "fwd"]
  beats = {tuple(b["key"]): bool(b["table_ms"]) and b["best_ms"] < b["table_ms"] / 1.03 for b in fwd}
  kept_title = "\nTUNED entries (triton_kernels/conv_tiles.py) that beat the tiles launched now by more than 3 %:"
  others_title = "\nthe others (within 3 % of the launched tiles"
  assert (kept_title in run.stdout, others_title in run.stdout) == (any(beats.values()), not all(beats.values()))
  kept, _, others = run.stdout.partition(others_title)
  for best in fwd:
    assert best["best_ms"] == min(r["ms"] for r in rows["fwd"] if r["key"] == best["key"])
    entry = f"{tuple(best['key'])}: {tuple(best['best'])},"
    listed, other = (kept, others) if beats[tuple(best["key"])] else (others, kept)
    assert entry in listed and entry not in other


def test_tune_kernels_offers_an_entry_only_where_it_beats_the_launched_tiles_by_more_than_the_spread():
  code = """
import sys, json; sys.path.insert(0, 'scripts/dev')
import tune_kernels
cases = [(0.96, 1.0), (0.975, 1.0), (1.0, 1.0), (0.5, None)]
print(json.dumps([tune_kernels.beats_launched(dict(best_ms=b, table_ms=t)) for b, t in cases]))
"""
  run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  assert json.loads(run.stdout.strip().splitlines()[-1]) == [True, False, False, False]


def test_tune_kernels_tries_the_filter_gradient_with_more_columns_per_program():
  code = """
import sys, json; sys.path.insert(0, 'scripts/dev')
import tune_kernels
from alexnet_jax.measure.kernel_shapes import ConvShape
shape = ConvShape('conv2', (96, 27, 27, 512), (48, 5, 5, 256), 1, 2, 2)
more, plain = (tune_kernels.candidates('wgrad', shape, c) for c in ((16384,), ()))
fwd = tune_kernels.candidates('fwd', shape, (16384,)) == tune_kernels.candidates('fwd', shape)
print(json.dumps(dict(first=more[0] == plain[0], plain=sorted({t.columns for t in plain}),
                      more=sorted({t.columns for t in more}), twice=len(more) == 2 * len(plain), fwd=fwd)))
"""
  run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  assert got == dict(first=True, plain=[4096], more=[4096, 16384], twice=True, fwd=True)
  bad = subprocess.run([sys.executable, "scripts/dev/tune_kernels.py", "--config", "configs/demo.py",
                        "--wgrad_columns", "8192,lots"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert bad.returncode != 0 and bad.stderr.strip().splitlines()[-1] == (
      "error: --wgrad_columns takes positive whole numbers of columns, got 8192,lots")


def test_tune_kernels_pairs_each_result_row_with_the_candidate_it_timed():
  # What the tuner times again in one worker, the candidates that ran out of memory beside the others, it finds by
  # pairing each row (as a worker sends it, and as the JSON holds it) with its job: the same candidate, no other.
  code = """
import sys, json; sys.path.insert(0, 'scripts/dev')
import tune_kernels
from alexnet_jax.measure.kernel_shapes import ConvShape
shape = ConvShape('conv2', (96, 27, 27, 512), (48, 5, 5, 256), 1, 2, 2)
conv = [dict(kernel='wgrad', key=('wgrad', 512, 48, 27, 27, 128, 5, 5, 1, 2, 2), tiles=t)
        for t in tune_kernels.candidates('wgrad', shape, (16384,))]
maps = [dict(kernel='lrn_bwd', key=('lrn_bwd', 96, 27, 27, 512, 2), tiles=t)
        for t in tune_kernels.map_candidates('lrn_bwd', 48)]
jobs = conv + maps
rows = [dict(kernel=j['kernel'], key=list(j['key']), tiles=list(tune_kernels._fields(j['tiles']))) for j in jobs]
stored = json.loads(json.dumps(rows))
ids = [tune_kernels._candidate(j) for j in jobs]
print(json.dumps(dict(distinct=len(set(ids)) == len(jobs), sent=[tune_kernels._candidate(r) for r in rows] == ids,
                      stored=[tune_kernels._candidate(r) for r in stored] == ids, jobs=len(jobs))))
"""
  run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  assert got["distinct"] and got["sent"] and got["stored"] and got["jobs"] > 60


def test_tune_kernels_min_tile_keeps_the_rule_and_the_large_tiles_only():
  code = """
import sys, json; sys.path.insert(0, 'scripts/dev')
import tune_kernels
from alexnet_jax.measure.kernel_shapes import ConvShape
shape = ConvShape('conv3_1', (128, 56, 56, 128), (128, 3, 3, 256), 1, 1, 1)
every, large = (tune_kernels.candidates('fwd', shape, min_tile=m) for m in (0, 128 * 128))
print(json.dumps(dict(rule=every[0] == large[0], large=[t.rows * t.cols for t in large[1:]],
                      kept=[t for t in every[1:] if t.rows * t.cols >= 128 * 128] == large[1:])))
"""
  run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  assert got["rule"] and got["kept"] and got["large"] and min(got["large"]) >= 128 * 128


def test_tune_kernels_chains_its_calls_in_one_program():
  # Every call stays a call of its own (not merged, not hoisted, its whole output made), the touched operand comes
  # back as it went in, and the output is fn's.
  code = """
import sys, json; sys.path.insert(0, 'scripts/dev')
import jax, jax.numpy as jnp, numpy as np
import tune_kernels
fn = jax.jit(lambda x, w: jnp.tanh(x @ w).sum(0))
x = jnp.asarray(np.random.default_rng(0).normal(size=(32, 32)), jnp.float32)
run = tune_kernels.chained(fn, 4, 1)
hlo = run.lower(x, jnp.copy(x.T)).compile().as_text()
out, back = run(x, jnp.copy(x.T))
print(json.dumps(dict(dots=hlo.count(" dot("), tanh=hlo.count(" tanh("), reduces=hlo.count(" reduce("),
                      same=bool(np.array_equal(back, x.T)), close=bool(np.allclose(out, fn(x, x.T))))))
"""
  run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  got = json.loads(run.stdout.strip().splitlines()[-1])
  assert got == dict(dots=4, tanh=4, reduces=4, same=True, close=True)


def test_tune_summary_times_the_table_s_tiles_where_a_key_is_tuned():
  from triton_kernels.conv_tiles import TUNED  # noqa: PLC0415

  key, fields = next(iter(TUNED.items()))
  other = [f * 2 if i == 0 else f for i, f in enumerate(fields)]
  rows = [dict(kernel=key[0], key=list(key), layers=["conv1 split"], tiles=tiles, rule=rule, ms=ms, tflops=1.0)
          for tiles, rule, ms in ((other, True, 0.3), (list(fields), False, 0.2))]  # as the JSON rows hold them
  code = ("import json, sys; sys.path.insert(0, 'scripts/dev'); import tune_kernels; "
          f"print(json.dumps(tune_kernels.summarise({rows!r})))")
  run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  (best,) = json.loads(run.stdout.strip().splitlines()[-1])
  assert (best["rule_ms"], best["table_ms"], best["best_ms"]) == (0.3, 0.2, 0.2) and best["best"] == list(fields)


def test_gemm_peak_times_square_multiplies_and_refuses_a_size_that_is_not_one(tmp_path):
  out = tmp_path / "gemm.json"
  run = subprocess.run([sys.executable, "scripts/dev/gemm_peak.py", "--sizes=64,128", "--calls=2", "--rounds=2",
                        f"--json={out}"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  result = json.loads(out.read_text())
  assert [r["n"] for r in result["rows"]] == [64, 128] and result["platform"] == "cpu"
  for r in result["rows"]:
    assert r["ms"] > 0 and r["tflops"] == pytest.approx(2 * r["n"] ** 3 / r["ms"] / 1e9)
    assert len(r["spread_ms"]) == 2 and min(r["spread_ms"]) <= r["ms"] <= max(r["spread_ms"])
  run = subprocess.run([sys.executable, "scripts/dev/gemm_peak.py", "--sizes=0"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert run.returncode != 0 and "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1] == "error: --sizes takes positive whole numbers, got 0"


# benchmark.py's arguments for one small row in this process, as each tree times it
ONE_ROW = [*SMALL, "--systems=plain:one", "--dtypes=float32", "--batches=4", "--steps=1", "--windows=1",
           "--noseparate", "--config.mesh.model=1"]


def ab_benchmark(*args):
  return subprocess.run([sys.executable, "scripts/dev/ab_benchmark.py", *args], cwd=ROOT, capture_output=True,
                        text=True, timeout=600)


needs_git = pytest.mark.skipif(
    subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True).returncode != 0,
    reason="needs this tree's git history (--before is a revision)")


@needs_git
def test_ab_benchmark_times_a_revision_against_this_tree_in_turns(tmp_path):
  out = tmp_path / "ab.json"
  # --after as a folder relative to where the script starts: each tree's runs start in the tree itself
  run = ab_benchmark("--before=HEAD", "--after=.", "--rounds=2", f"--json={out}", "--", "--config", "configs/demo.py",
                     *ONE_ROW)
  assert run.returncode == 0, run.stderr[-2000:]
  result = json.loads(out.read_text())
  # in turns: before then after, then after then before; HEAD exported to a folder of its own
  assert [(r["round"], r["tree"]) for r in result["rounds"]] == [(1, "before"), (1, "after"), (2, "after"),
                                                                   (2, "before")]
  rates = {t: sorted(r["rows"][0]["images_per_s"] for r in result["rounds"] if r["tree"] == t)
           for t in ("before", "after")}
  (row,) = result["rows"]
  assert (row["config"], row["system"], row["devices"], row["batch"]) == ("demo", "plain:one", 1, 4)
  assert row["before"] == pytest.approx(sum(rates["before"]) / 2) and row["after"] == pytest.approx(
      sum(rates["after"]) / 2)
  assert row["ratio"] == pytest.approx(row["after"] / row["before"])
  assert f"{row['ratio']:.3f}" in run.stdout.splitlines()[-2]


def test_ab_benchmark_refuses_a_before_that_is_no_tree_and_its_own_flags_after_the_separator(tmp_path):
  run = ab_benchmark("--before=no-such-revision", "--", "--config", "configs/demo.py")
  assert run.returncode != 0 and run.stderr.strip().splitlines()[-1].startswith(
      "error: --before 'no-such-revision' is neither a folder nor a git revision")
  run = ab_benchmark("--before=HEAD", "--", "--config", "configs/demo.py", "--json=x.json")
  assert run.returncode != 0 and "give --json before `--`" in run.stderr.strip().splitlines()[-1]
  # a folder without the project: a run there would import the installed copy and time this tree twice
  run = ab_benchmark(f"--before={tmp_path}", "--", "--config", "configs/demo.py")
  assert run.returncode != 0 and run.stderr.strip().splitlines()[-1].startswith(
      f"error: {tmp_path} holds no tree of this project: a run there imports alexnet_jax from ")


@needs_git
def test_ab_benchmark_keeps_the_runs_before_one_that_fails(tmp_path):
  # An after tree whose benchmark cannot run: the before tree's run, made first, stays in --json.
  broken = tmp_path / "broken"
  broken.mkdir()
  archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", "HEAD"], capture_output=True, check=True)
  subprocess.run(["tar", "-x", "-C", str(broken)], input=archive.stdout, check=True)
  (broken / "scripts" / "benchmark.py").write_text("raise SystemExit('this tree cannot time')\n")
  out = tmp_path / "ab.json"
  run = ab_benchmark("--before=HEAD", f"--after={broken}", f"--json={out}", "--", "--config", "configs/demo.py",
                     *ONE_ROW)
  assert run.returncode != 0 and run.stderr.strip().splitlines()[-1] == (
      f"error: after's benchmark.py wrote no rows: this tree cannot time (the runs before it are in {out})")
  (done,) = json.loads(out.read_text())["rounds"]
  assert done["tree"] == "before" and done["rows"][0]["images_per_s"] > 0
