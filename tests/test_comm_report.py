"""scripts/comm_report.py: each strategy's compiled step moves what its placement plan says, layer by layer, and
nothing else but what lies outside the network; one compiled check per strategy (tests/test_placement.py reads the
plans themselves)."""

import json
import os
import subprocess
import sys

import pytest

from alexnet_jax.config import paper_config
from alexnet_jax.measure import comm, hlo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(width=0.0625, image_size=64, batch_size=8)  # the demo's network, small enough to compile in seconds


def tiny_config(**changes):
  c = paper_config()
  c.update(TINY | dict(weight_init="he") | changes)
  c.dataset.name, c.dataset.num_classes = "procedural", 10
  return c


def by_row(records):
  return {(r["layer"], r["kind"]): r for r in records}


def assert_as_planned(records):
  for r in records:
    if r["analytic_bytes"] is not None:  # a layer's: the HLO moves the plan's bytes (twice in float32 on CPU)
      assert r["bytes"] == r["analytic_bytes"] * (2 if r["float32_on_cpu"] else 1), r


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_paper_split_moves_maps_only_at_conv3_and_the_fc_layers(dtype):
  records = comm.records(tiny_config(), "tower", dtype, 8)
  assert_as_planned(records)
  assert set(by_row(records)) == {("conv3", "all-gather"), ("conv3", "reduce-scatter"), ("fc6", "all-gather"),
                                  ("fc6", "reduce-scatter"), ("fc7", "all-gather"), ("fc7", "reduce-scatter"),
                                  ("fc8", "all-reduce")}
  assert all(r["float32_on_cpu"] == (dtype == "bfloat16" and r["kind"] != "all-reduce") for r in records)
  assert "| conv3 (tower) |  | gather | whole |" in records[0]["plan"]


def test_one_device_moves_nothing():
  records = comm.records(tiny_config(mesh=dict(model=1, data=1)), "tower", "float32", 8)
  assert [r["layer"] for r in records] == [None] and "| conv3 (tower) |  |  | whole |" in records[0]["plan"]


def test_rows_spread_over_the_towers_are_gathered_as_the_input():
  records = comm.records(tiny_config(gather_input=True), "tower", "float32", 8)
  assert_as_planned(records)
  outside = {key: r["bytes"] for key, r in by_row(records).items() if r["analytic_bytes"] is None}
  # Each device its own rows: the towers gather the others' uint8 crops and colour shifts, and the labels.
  assert outside == {("input", "all-gather"): 8 * 64 * 64 * 3 + 8 * 3 * 4, ("labels", "all-gather"): 8 * 4}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_data_parallelism_and_the_hybrid_move_what_their_plans_say(dtype):
  # In bfloat16 too the weights' gradients are summed in float32, as the plan counts them.
  data = comm.records(tiny_config(mesh=dict(model=1, data=2)), "data", dtype, 8)
  assert_as_planned(data)
  convs_and_fcs = {f"conv{i}" for i in range(1, 6)} | {"fc6", "fc7", "fc8"}
  assert {layer for layer, kind in by_row(data) if kind == "all-reduce"} >= convs_and_fcs
  hybrid = comm.records(tiny_config(), "hybrid", dtype, 8)
  assert_as_planned(hybrid)
  assert {key for key in by_row(hybrid) if key[0].startswith("fc")} == {
      ("fc6", "all-gather"), ("fc6", "reduce-scatter"), ("fc7", "all-gather"), ("fc7", "reduce-scatter"),
      ("fc8", "all-reduce")}
  # The batch is split over both devices at the input and over 'data' alone at the output: the labels move.
  assert ("labels", "all-gather") in by_row(hybrid)


def test_the_shipped_per_layer_config_reports_its_own_placement(tmp_path):
  out = tmp_path / "report.json"
  run = subprocess.run([sys.executable, "scripts/comm_report.py", "--config", "configs/alexnet_one_weird_trick.py",
                        "--config.cpu_devices=2", "--config.width=0.0625", "--config.image_size=64", "--batches=8",
                        f"--json={out}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  records = json.loads(out.read_text())
  assert {r["strategy"] for r in records} == {"table"}
  assert_as_planned(records)
  rows = by_row(records)
  assert {layer for layer, kind in rows if kind == "all-reduce" and layer.startswith("conv")} == {
      f"conv{i}" for i in range(1, 6)}  # every filter on both devices: their gradients summed
  assert rows["fc6", "all-gather"]["participants"] == 2  # the batch gathered where the fc slices begin
  assert "| fc6 (model) | gather |" in records[0]["plan"] and "| table | float32 | 8 | 1 × 2 |" in run.stdout


def test_a_combined_all_reduce_is_split_by_the_layers_it_carries():
  line = ('%g = (f32[2]{0}, f32[6]{0}, f32[]) all-reduce(%p, %q, %r), replica_groups={{0,1}}, '
          'metadata={op_name="jit(step)/(t/Network/fc6/w:t/Network/conv3/w:metrics/reduce_sum)"}')
  (c,) = hlo.collectives(line)
  assert c.bytes == 36 and c.by_layer(["conv3", "fc6"], {"metrics": "metrics"}) == {"fc6": 8, "conv3": 24,
                                                                                     "metrics": 4}
  assert c.by_layer(["conv3", "fc6"]) == {"fc6": 8, "conv3": 24, "other": 4}


def test_report_places_the_towers_as_the_benchmark_on_eight_devices(tmp_path):
  out = tmp_path / "report.json"
  run = subprocess.run([sys.executable, "scripts/comm_report.py", "--config", "configs/demo.py",
                        "--config.width=0.0625", "--config.image_size=64", "--config.cpu_devices=8", "--devices=8",
                        "--strategies=tower", "--batches=16", f"--json={out}"], cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
  assert run.returncode == 0, run.stderr[-2000:]
  records = json.loads(out.read_text())
  # The towers × data parallelism over the pairs (tests/test_scaling.py times the others).
  assert {(r["mesh"]["data"], r["mesh"]["model"]) for r in records} == {(4, 2)}
  assert_as_planned(records)
  # fc8's partial logits are summed over the towers, its gradient over the pairs' data shards.
  assert {(r["kind"], r["participants"]) for r in records if r["layer"] == "fc8"} == {
      ("all-reduce", 2), ("all-reduce", 4)}
  assert "| tower | float32 | 16 | 4 × 2 |" in run.stdout
