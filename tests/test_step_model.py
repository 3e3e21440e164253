"""alexnet_jax/measure/step_model.py and scripts/step_model.py: the step-time model against every recorded step,
NCCL's ring costs, the placement search, and the script; CPU only, nothing compiled."""

import json
import os
import subprocess
import sys

import pytest

from alexnet_jax.measure import step_model
from alexnet_jax.network.placement import plan
from alexnet_jax.network.table import STRATEGIES, alexnet, get_network, with_places

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOLERANCE = 0.15  # docs/step_model.md's claim for every row


def test_the_model_predicts_every_recorded_step_within_15_percent():
  checks = step_model.checks()
  assert len(checks) >= 27 and {c.devices for c in checks} == {1, 2}
  for c in checks:  # the measured figure is the raw file's own row
    rows = json.load(open(os.path.join(step_model.RESULTS, c.file)))
    assert c.measured in [r["images_per_s"] for r in rows if r["system"] == c.system and r["batch"] == c.batch]
  worst = max(checks, key=lambda c: abs(c.error))
  assert abs(worst.error) < TOLERANCE, worst
  named = {(c.file, c.system, c.batch) for c in checks}
  for batch in (128, 512, 1024):
    assert ("step_2026-12-01_split_tuned.json", "triton:split", batch) in named
    for system in step_model.MULTI:
      assert (f"strategies_2026-11-30_h200x2_b{batch}.json", system, batch) in named


def test_the_global_parameters_are_the_fit_of_the_fit_rows_alone():
  assert step_model.fit() == (step_model.COLLECTIVE_US, step_model.OVERLAP)
  fitted = [c for c in step_model.checks() if c.fitted]
  assert len(fitted) == 3 and {c.file for c in fitted} == set(step_model.FIT)


def test_one_gpu_is_the_profiled_step_at_each_profiled_batch():
  profile = step_model.load_profile()
  for path in profile.sources:
    summary = json.load(open(os.path.join(step_model.RESULTS, path)))
    p = step_model.predict(alexnet(), "tower", 1, summary["batch"])
    assert p.step_ms == pytest.approx(summary["untraced_step_ms"], rel=1e-9)
    assert p.comm_ms == 0 and p.bytes == 0


def test_vgg16_on_one_gpu_is_its_profiled_step_at_each_profiled_batch():
  profile = step_model.load_profile(step_model.profile_pattern("vgg16"))
  assert profile.sources == tuple(f"profile_vgg16_one_h200_2026-12-03_b{b}.json" for b in (32, 64, 128, 256))
  for path in profile.sources:
    summary = json.load(open(os.path.join(step_model.RESULTS, path)))
    for strategy in ("data", "hybrid"):
      p = step_model.predict(get_network("vgg16", towers=1), strategy, 1, summary["batch"])
      assert p.step_ms == pytest.approx(summary["untraced_step_ms"], rel=1e-9) and p.bytes == 0
  recorded = step_model.one_gpu_checks("vgg16")[0]  # docs/BENCHMARKS.md's row, measured at an older commit
  assert (recorded.batch, recorded.measured) == (64, 4060.0) and abs(recorded.error) < 0.05


def test_ring_costs_follow_nccl_s_formulas():
  slow = step_model.Link("slow", 100.0, 0.0, "")
  fast = step_model.Link("fast", 200.0, 0.0, "")
  size = 1e9
  assert step_model.ring_all_reduce_ms(size, 4, slow) == pytest.approx(2 * 3 / 4 * size / 100e6)
  assert step_model.ring_gather_ms(size, 4, slow) == pytest.approx(3 / 4 * size / 100e6)
  assert step_model.ring_all_reduce_ms(size, 8, fast) == pytest.approx(step_model.ring_all_reduce_ms(size, 8, slow) / 2)
  latency = step_model.Link("latency", 1e12, 5.0, "")
  assert step_model.ring_all_reduce_ms(0, 8, latency) == pytest.approx(2 * 7 * 5e-3)
  assert step_model.ring_gather_ms(0, 8, latency) == pytest.approx(7 * 5e-3)
  assert step_model.ring_all_reduce_ms(size, 1, slow) == 0


def test_a_collective_over_hosts_runs_in_two_levels():
  nv, net = step_model.Link("nv", 400.0, 0.0, ""), step_model.Link("net", 40.0, 0.0, "")
  one_host = step_model.Hosts(8, 1, nv, net)
  assert one_host.collective_ms("all-reduce", 1e9, tuple(range(8))) == step_model.ring_all_reduce_ms(1e9, 8, nv)
  two = step_model.Hosts(8, 2, nv, net)
  expected = 2 * step_model.ring_gather_ms(1e9, 8, nv) + step_model.ring_all_reduce_ms(1e9 / 8, 2, net)
  assert two.collective_ms("all-reduce", 1e9, tuple(range(16))) == pytest.approx(expected)
  # one GPU a host: every byte crosses the network
  assert two.collective_ms("all-reduce", 1e9, (0, 8)) == pytest.approx(step_model.ring_all_reduce_ms(1e9, 2, net))


def test_doubling_nvlink_s_bandwidth_halves_the_data_parallel_gradients_time():
  nv = step_model.LINKS["nvlink4"]
  zero = dict(launch_us=0.0, overlap=0.0)
  slow = step_model.predict(alexnet(), "data", 2, 256, step_model.Link("a", nv.busbw_gbs, 0.0, ""), **zero)
  fast = step_model.predict(alexnet(), "data", 2, 256, step_model.Link("b", 2 * nv.busbw_gbs, 0.0, ""), **zero)
  assert fast.gradient_ms == pytest.approx(slow.gradient_ms / 2)
  assert fast.compute_ms == slow.compute_ms


@pytest.mark.parametrize("devices", [2, 4, 8])
def test_the_search_finds_a_valid_placement_no_slower_than_the_named_strategies(devices):
  table = alexnet()
  searched = step_model.search(table, devices, 128 * devices)
  best = searched.best
  placed = with_places(table, best.places)  # the table's rules accept it
  plan(placed, "table", best.model, best.data)
  assert best.model * best.data == devices and best.memory_bytes <= step_model.H200_MEMORY
  assert set(searched.named) == set(STRATEGIES)
  assert best.step_ms <= min(p.step_ms for p in searched.named.values())
  again = step_model.predict(placed, "table", devices, 128 * devices, model=best.model)
  assert again.step_ms == pytest.approx(best.step_ms)


def test_a_table_or_crop_the_profiles_do_not_time_is_refused():
  with pytest.raises(ValueError, match="no measured kernel times for layer conv1_2 as"):  # VGG-11 lacks VGG-16's
    step_model.predict(get_network("vgg11", towers=1), "data", 2, 256)
  with pytest.raises(ValueError, match="no measured kernel times for layer conv1 as"):
    step_model.predict(alexnet(width=0.5), "tower", 2, 256)
  with pytest.raises(ValueError, match="224"):
    step_model.predict(alexnet(), "tower", 2, 256, image_size=192)
  with pytest.raises(ValueError, match="unknown link"):
    step_model.predict(alexnet(), "tower", 2, 256, "token-ring")


@pytest.mark.parametrize("devices,hosts", [(8, 1), (64, 8)])
def test_the_search_on_vgg16_returns_a_valid_placement(devices, hosts):
  table = get_network("vgg16", towers=1)
  searched = step_model.search(table, devices, 32 * devices, hosts=hosts)
  best = searched.best
  plan(with_places(table, best.places), "table", best.model, best.data)
  assert set(searched.named) == {"data", "hybrid"} and best.model * best.data == devices
  assert best.step_ms <= min(p.step_ms for p in searched.named.values())
  assert best.memory_bytes <= step_model.H200_MEMORY


def run_script(*args):
  return subprocess.run([sys.executable, "scripts/step_model.py", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)


def test_the_script_prints_the_checks_and_the_searched_placements(tmp_path):
  out = tmp_path / "model.json"
  run = run_script("--config", "configs/alexnet_2gpu.py", "--devices", "2,4", "--hosts", "1", "--link", "nvlink4",
                   "--json", str(out))
  assert run.returncode == 0, run.stderr
  assert "| step_2026-12-01_split_tuned.json | triton:split | 1024 | 2 |" in run.stdout
  assert "largest error" in run.stdout and "| 4 (1) | 512 | searched |" in run.stdout
  assert "mesh.model=4" in run.stdout
  written = json.loads(out.read_text())
  assert len(written["checks"]) >= 27 and [p["gpus"] for p in written["predictions"]] == [2, 4]
  assert all(abs(c["error"]) < TOLERANCE for c in written["checks"])


def test_the_script_s_help_and_errors():
  assert run_script("--help").returncode == 0
  bad = run_script("--config", "configs/alexnet_2gpu.py", "--link", "token-ring", "--nochecks")
  assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
      "error: unknown link 'token-ring'; choose one of nvlink4, pcie5, ib_ndr, eth100"]


def test_the_script_draws_the_scaling_figure(tmp_path):
  png = tmp_path / "scaling.png"
  run = run_script("--png", str(png))
  assert run.returncode == 0, run.stderr
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert "| VGG-16 | 64 (8) | 32 | 2048 | searched |" in run.stdout
  assert "| AlexNet | 2 (1) | 128 | 256 | tower | 1 × 2 |" in run.stdout and "(567173f: " in run.stdout
  assert "| docs/BENCHMARKS.md, 2026-11-30 (630d65b) | triton:one | 64 | 1 |" in run.stdout
  assert run_script("--nochecks").stderr.strip().splitlines() == [
      "error: --config is needed (or --png for the scaling figure)"]
