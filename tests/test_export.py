"""Portable artifacts (alexnet_jax/export.py, scripts/export.py): the inference function and the train step exported
for CPU and TPU on this CPU host, serialised, loaded and run on the CPU's two devices, equal to the live model; a
bfloat16 TPU export that carries none of the CPU's workarounds; the refusals, in one line."""

import functools
import os
import re
import runpy
import subprocess
import sys

import jax
import numpy as np
import pytest

from alexnet_jax import export
from alexnet_jax.data import eval_batches, get_dataset, train_batches
from alexnet_jax.network import sharding
from alexnet_jax.training import checkpoints, loop, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# configs/demo.py (two towers on two devices, procedural data) at 64 pixels and 4 images a batch.
OVERRIDES = ("--config.image_size=64", "--config.batch_size=4", "--config.eval_batch_size=4",
             "--config.dataset.num_train_examples=200", "--config.dataset.num_eval_examples=8")


def demo_config(**changes):
  config = runpy.run_path(os.path.join(ROOT, "configs", "demo.py"))["get_config"]()
  for flag in OVERRIDES:
    key, value = flag.removeprefix("--config.").split("=")
    *parents, leaf = key.split(".")
    functools.reduce(getattr, parents, config)[leaf] = int(value)
  config.update(changes)
  return config


def max_difference(a, b) -> float:
  """The largest absolute difference between two pytrees of arrays (float64)."""
  diffs = jax.tree.map(lambda x, y: float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64))))
                       if np.size(x) else 0.0, a, b)
  return max(jax.tree.leaves(diffs), default=0.0)


def assert_same(got, want):
  scale = max(float(np.max(np.abs(np.asarray(leaf, np.float64)))) for leaf in jax.tree.leaves(want))
  assert max_difference(got, want) <= 1e-5 * max(scale, 1.0)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A workdir whose checkpoint holds weights unlike any fresh initialisation's (1.5× a fresh state's), written by
  training's own orbax code: (workdir, config, setup, state)."""
  workdir = str(tmp_path_factory.mktemp("run"))
  config = demo_config()
  dataset = get_dataset(config)
  setup = train.dataset_setup(config, dataset)
  state = train.create_train_state(setup, jax.random.key(config.seed))
  state = state.replace(params=jax.tree.map(lambda p: 1.5 * p, state.params))
  manager = checkpoints.manager(workdir, config)
  checkpoints.save(manager, 1, state, loop.data_position(config, dataset, 1))
  manager.wait_until_finished()
  return workdir, config, setup, state


def test_script_exports_inference_for_cpu_and_tpu_that_runs_here_like_the_live_model(run):
  workdir, config, setup, state = run
  out = os.path.join(workdir, "model.jaxexport")
  done = subprocess.run([sys.executable, "scripts/export.py", "--config", "configs/demo.py", *OVERRIDES,
                         "--workdir", workdir, "--platforms", "cpu,tpu", "--out", out],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "logits for cpu, tpu on 2 device(s): (uint8[4, 64, 64, 3]) → (float32[4, 10])" in done.stdout
  loaded = export.load(out)
  batch = next(eval_batches(get_dataset(config), 4))
  images = jax.device_put(batch["image"], loaded.in_shardings_jax(setup.mesh)[0])
  live = train.logits_fn(setup)(state.params, train.eval_input(setup, batch["image"]), jax.random.key(0), False)
  assert_same(loaded.call(images), live)


def test_inference_of_normalised_chwn_crops(run):
  _, config, setup, state = run
  exported = export.export_inference(setup, state.params, platforms=["cpu", "tpu"], batch_size=4,
                                     input_kind="chwn")
  loaded = jax.export.deserialize(exported.serialize())
  images = jax.random.normal(jax.random.key(1), (3, 64, 64, 4))
  live = sharding.sharded_apply(setup.net, setup.mesh)(state.params, images, jax.random.key(0), False)
  assert_same(loaded.call(jax.device_put(images, loaded.in_shardings_jax(setup.mesh)[0])), live)


def test_train_step_exported_for_cpu_and_tpu_runs_here_like_the_live_step(run):
  _, config, setup, state = run
  exported = export.export_train_step(setup, platforms=["cpu", "tpu"], batch_size=4)
  loaded = jax.export.deserialize(exported.serialize())  # TrainState and optax's states: registered by the module
  batch = setup.batch_rows.put(train_batches(get_dataset(config), 4)[0][0])
  key = jax.random.key(7)
  live_state, live_metrics = jax.jit(functools.partial(train.train_step, setup=setup))(state, batch, key)
  new_state, metrics = loaded.call(state, batch, key)
  assert isinstance(new_state, train.TrainState) and int(new_state.step) == int(state.step) + 1
  assert_same(metrics, live_metrics)
  assert_same(new_state, live_state)


def test_bfloat16_tpu_export_carries_no_cpu_workaround():
  # XLA:CPU needs the cross-tower gathers' gradients (reduce-scatters) in float32. The choice is made per lowering
  # platform, and a one-platform artifact keeps only that platform's branch of each choice: for TPU the
  # reduce-scatters are bfloat16, and no Triton kernel or callback is left.
  config = demo_config(dtype="bfloat16")
  setup = train.make_setup(config, 10, 200)

  def module(platforms):
    exported = export.export_train_step(setup, platforms=platforms, batch_size=4)
    return jax.export.deserialize(exported.serialize()).mlir_module()

  def scatter_types(text):
    return re.findall(r'"stablehlo.reduce_scatter"\(.*?[)>] : \(tensor<[^>]*>\) -> tensor<[0-9x]*x(\w+)>', text, re.S)

  tpu, cpu = module(["tpu"]), module(["cpu"])
  assert scatter_types(tpu) == ["bf16"] * 3  # conv3, fc6, fc7 read across towers
  assert scatter_types(cpu) == ["f32"] * 3
  assert "custom_call" not in tpu  # neither a Triton kernel nor a host callback


def test_refusals_are_one_clear_line(run):
  _, config, setup, _ = run
  with pytest.raises(ValueError, match="export platforms must be some of cpu, cuda, rocm, tpu; got gpu"):
    export.check_platforms(["gpu"], "auto")
  with pytest.raises(ValueError, match="'interpret' runs the kernels in host callbacks"):
    export.check_platforms(["cpu"], "interpret")
  assert export.check_platforms(["cpu", "cuda"], "xla") == ("cpu", "cuda")  # XLA's own ops lower for CUDA anywhere
  done = subprocess.run([sys.executable, "scripts/export.py", "--config", "configs/demo.py", *OVERRIDES,
                         "--function", "train_step", "--platforms", "cpu,cuda", "--out", "unused.jaxexport"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode != 0 and "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith(
      "error: exporting the Triton kernels for cuda needs a CUDA GPU here")
  assert not os.path.exists(os.path.join(ROOT, "unused.jaxexport"))
