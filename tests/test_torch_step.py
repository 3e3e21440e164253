"""The benchmark's PyTorch rows (measure/torch_step.py): which compile mode a row reports, how it lists the others,
the bound on a mode's compilation, and the flags that choose them. torch itself is on the GPU image only: the tests
that build its network skip without it."""

import os
import subprocess
import sys
import time

import pytest

from alexnet_jax.measure import systems, torch_step
from alexnet_jax.network.table import alexnet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def benchmark(*args):
  return subprocess.run([sys.executable, "scripts/benchmark.py", "--config", "configs/demo.py", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=60)


def test_the_row_reports_the_fastest_mode_that_ran():
  modes = {"default": dict(images_per_s=16_000.0), "reduce-overhead": dict(error="RuntimeError: no graph"),
           "max-autotune-no-cudagraphs": dict(images_per_s=18_500.0)}
  assert torch_step.best_mode(modes) == "max-autotune-no-cudagraphs"
  assert torch_step.best_mode({"default": dict(error="TimeoutError: compiling took over 1 s")}) is None


def test_the_modes_line_gives_each_mode_s_figure_or_why_it_did_not_run():
  row = dict(system="torch:one", batch=128, torch_modes={
      "default": dict(images_per_s=16_957.2, compile_s=41.6),
      "max-autotune-no-cudagraphs": dict(error="TimeoutError: compiling took over 150 s (--torch_compile_limit_s)")})
  assert torch_step.modes_line(row) == (
      "torch:one batch 128: default 16,957 img/s (compiled in 42 s); max-autotune-no-cudagraphs error: TimeoutError: "
      "compiling took over 150 s (--torch_compile_limit_s)")


def test_a_compilation_past_its_limit_is_given_up_and_the_next_runs_unbounded():
  t0 = time.perf_counter()
  with pytest.raises(TimeoutError, match="took over 0.05 s"), torch_step.time_limit(0.05):
    while time.perf_counter() - t0 < 5:
      pass
  assert time.perf_counter() - t0 < 1
  with torch_step.time_limit(None):  # no limit: no alarm left behind either
    time.sleep(0.1)


def test_benchmark_refuses_an_unknown_compile_mode_and_a_split_torch_flat_in_one_line():
  run = benchmark("--systems=torch:one", "--torch_modes=default,fast")
  assert run.returncode != 0 and "Traceback" not in run.stderr
  assert run.stderr.strip().splitlines()[-1] == (
      "error: --torch_modes: fast not among default, reduce-overhead, max-autotune-no-cudagraphs")
  run = benchmark("--systems=torch_flat:split")
  assert run.returncode != 0 and run.stderr.strip().splitlines()[-1] == (
      "error: system torch_flat:split: the PyTorch step (measure/torch_step.py) runs on one GPU: torch_flat:one")
  assert systems.System.parse("torch_flat:one").impl in systems.TORCH


def test_the_flat_reference_is_the_table_with_one_tower():
  torch = pytest.importorskip("torch", reason="torch is on the GPU image only; the torch_flat row runs it there")
  model = torch_step.build(alexnet(towers=1), 224)
  assert [m.groups for m in model if isinstance(m, torch.nn.Conv2d)] == [1, 1, 1, 1, 1]
  assert not any(type(m).__name__ == "TowerLRN" for m in model)  # one LRN over all channels
  assert model.eval()(torch.zeros(2, 3, 224, 224)).shape == (2, 1000)
