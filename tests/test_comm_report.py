"""scripts/comm_report.py: every collective of each strategy's compiled step, per layer, equal to what the layer
table implies."""

import json
import os
import subprocess
import sys

from alexnet_jax import hlo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_report_matches_the_layer_table_for_every_strategy(tmp_path):
  out = tmp_path / "report.json"
  run = subprocess.run([sys.executable, "scripts/comm_report.py", "--config", "configs/demo.py",
                        "--config.width=0.0625", "--config.image_size=64", "--batches=8", f"--json={out}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  records = json.loads(out.read_text())
  by = {s: [r for r in records if r["strategy"] == s] for s in ("tower", "data", "hybrid")}
  for rows in by.values():
    assert all(r["bytes"] == r["analytic_bytes"] for r in rows if r["layer"] != "input+loss"), rows
  # The paper's towers talk at conv3 and the fc layers only; data parallelism sums each layer's gradient over both
  # devices; the hybrid does that for the convolutions and moves activations at the fc layers.
  assert {r["layer"] for r in by["tower"]} == {"conv3", "fc6", "fc7", "fc8", "input+loss"}
  assert {(r["layer"], r["kind"]) for r in by["data"] if r["layer"] != "input+loss"} == {
      (f"{n}", "all-reduce") for n in ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8")}
  assert {(r["layer"], r["kind"]) for r in by["hybrid"] if r["layer"].startswith("fc")} == {
      ("fc6", "all-gather"), ("fc6", "reduce-scatter"), ("fc7", "all-gather"), ("fc7", "reduce-scatter"),
      ("fc8", "all-reduce")}
  assert "| tower | 8 |" in run.stdout and "| hybrid | 8 |" in run.stdout


def test_a_combined_all_reduce_is_split_by_the_layers_it_carries():
  line = ('%g = (f32[2]{0}, f32[6]{0}, f32[]) all-reduce(%p, %q, %r), replica_groups={{0,1}}, '
          'metadata={op_name="jit(step)/(t/Network/fc6/w:t/Network/conv3/w:reduce_sum)"}')
  (c,) = hlo.collectives(line)
  assert c.bytes == 36 and c.by_layer(["conv3", "fc6"]) == {"fc6": 8, "conv3": 24, "input+loss": 4}


def test_report_places_the_towers_as_the_benchmark_on_eight_devices(tmp_path):
  out = tmp_path / "report.json"
  run = subprocess.run([sys.executable, "scripts/comm_report.py", "--config", "configs/demo.py",
                        "--config.width=0.0625", "--config.image_size=64", "--config.cpu_devices=8", "--devices=8",
                        "--strategies=tower", "--batches=16", f"--json={out}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  records = json.loads(out.read_text())
  # Issue 14's row (b): the towers × data parallelism over the pairs (tests/test_scaling.py times the others).
  assert {(r["mesh"]["data"], r["mesh"]["model"]) for r in records} == {(4, 2)}
  assert all(r["bytes"] == r["analytic_bytes"] for r in records if r["layer"] != "input+loss"), records
  # fc8's partial logits are summed over the towers, its gradient over the pairs' data shards.
  assert {(r["kind"], r["participants"]) for r in records if r["layer"] == "fc8"} == {
      ("all-reduce", 2), ("all-reduce", 4)}
  assert "| tower | 16 | 4 × 2 |" in run.stdout
