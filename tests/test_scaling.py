"""Scaling rows on simulated CPU devices: scripts/benchmark.py places each layout on the first N of 8 devices at a
batch per device (the paper's towers × data parallelism over the pairs, the hybrid over all of them), its compiled
collectives are the placement plan's, and scripts/scaling_report.py tables and plots the rows. (Every layout with
each backend, interpret's Triton kernels included, on 4 and 8 devices takes minutes: run by hand, as
docs/results/scaling_h200.md says.)"""

import json
import os
import subprocess
import sys

import pytest

from alexnet_jax.measure import systems
from alexnet_jax.network import placement
from alexnet_jax.network.table import alexnet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--config.width=0.0625", "--config.image_size=64", "--config.cpu_devices=8"]


def script(name, *args):
  env = dict(os.environ, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, f"scripts/{name}", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=600, env=env)


def benchmark_rows(workdir):
  out = os.path.join(workdir, "rows.json")
  run = script("benchmark.py", "--config", "configs/demo.py", *TINY, "--systems=xla:split,xla:hybrid",
               "--devices=1,8", "--per_device_batches=1", "--steps=1", "--windows=1", "--noseparate", f"--json={out}")
  assert run.returncode == 0, run.stderr[-2000:]
  return out


@pytest.fixture
def rows(once):
  return once("scaling_rows", benchmark_rows)[1]


def test_layouts_spread_over_the_devices_at_a_batch_per_device(rows):
  found = {(r["system"], r["devices"]): r for r in json.load(open(rows))}
  meshes = {key: (r["mesh"]["data"], r["mesh"]["model"], r["batch"]) for key, r in found.items()}
  assert meshes == {("xla:split", 1): (1, 1, 1), ("xla:split", 8): (4, 2, 8),
                    ("xla:hybrid", 1): (1, 1, 1), ("xla:hybrid", 8): (1, 8, 8)}
  table = alexnet(num_classes=10, width=0.0625)
  for (system, devices), r in found.items():
    assert r["per_device_batch"] == 1 and r["images_per_s"] > 0
    if devices > 1:  # every layer's collectives are the ones the plan says for the row's mesh
      plan = placement.plan(table, systems.STRATEGIES[system.split(":")[1]], r["mesh"]["model"], r["mesh"]["data"])
      expected = {}
      for (layer, kind, _), size in plan.traffic(64, devices).items():
        expected[f"{layer} {kind}"] = expected.get(f"{layer} {kind}", 0) + size  # fc8's logits and its gradient
      assert {k: v for k, v in r["collective_bytes"].items() if k.split()[0] in table.names} == expected, system


def test_scaling_report_tables_efficiency_and_plots_images_per_second(rows, tmp_path):
  png, md = tmp_path / "scaling.png", tmp_path / "scaling.md"
  run = script("scaling_report.py", rows, f"--png={png}", f"--markdown={md}")
  assert run.returncode == 0, run.stderr[-2000:]
  found = {(r["system"], r["devices"]): r for r in json.load(open(rows))}
  split8 = found["xla:split", 8]
  one = max(found["xla:split", 1]["images_per_s"], found["xla:hybrid", 1]["images_per_s"])  # the same step on one
  efficiency = split8["images_per_s"] / (8 * one)
  assert f"| xla:split | float32 | 8 | 8 | {split8['images_per_s']:,.0f} | {efficiency:.0%} |" in md.read_text()
  assert md.read_text().count("| xla:hybrid | float32 |") == 4  # batch 1 per device, and the best batch
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_scaling_report_refuses_what_is_not_benchmark_rows_in_one_line(tmp_path):
  bad = tmp_path / "bad.json"
  bad.write_text('{"rows": 1}')
  run = script("scaling_report.py", str(bad))
  assert run.returncode != 0 and "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1] == f"error: {bad}: not a file of benchmark rows (a JSON list of rows, " \
                                                "each with its 'system')"


def test_scaling_report_sets_a_system_without_a_one_device_row_against_its_implementations(rows, tmp_path):
  kept = [r for r in json.load(open(rows)) if (r["system"], r["devices"]) != ("xla:hybrid", 1)]
  path, md = tmp_path / "rows.json", tmp_path / "scaling.md"
  path.write_text(json.dumps(kept))
  run = script("scaling_report.py", str(path), f"--markdown={md}")
  assert run.returncode == 0, run.stderr[-2000:]
  found = {(r["system"], r["devices"]): r for r in kept}
  hybrid8 = found["xla:hybrid", 8]
  efficiency = hybrid8["images_per_s"] / (8 * found["xla:split", 1]["images_per_s"])  # on one device, the same step
  assert f"| xla:hybrid | float32 | 8 | 8 | {hybrid8['images_per_s']:,.0f} | {efficiency:.0%} |" in md.read_text()
