"""kernel_backend 'auto' on CUDA runs each convolution direction as our kernel or XLA's convolution, whichever the
measured table has faster (ops/conv_choice.py): the table's reading here, and XLA's substitutes against the kernels
under the Triton interpreter. tests/test_gpu_kernels.py checks what the CUDA program runs."""

import ast
import glob
import json
import os
import runpy
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from alexnet_jax.config import network_table
from alexnet_jax.measure.kernel_shapes import grouped_convs
from alexnet_jax.ops import conv as conv_op
from alexnet_jax.ops.conv_choice import MARGIN, MEASURED, xla_faster
from triton_kernels.conv_tiles import tile_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
X, W = (96, 54, 54, 128), (96, 5, 5, 256)  # a stride-2 5×5 layer (ZFNet's conv2) at batch 128
LAYER = dict(stride=2, padding=2, groups=1)


def table(ours: float, xla: float, batch: int = 128) -> dict:
  return {("dgrad", batch, 96, 54, 54, 256, 5, 5, 2, 2, 1): (ours, xla)}


def faster(measured, kernel="dgrad", batch=128, dtype="bfloat16"):
  return xla_faster(kernel, (*X[:3], batch), W, *LAYER.values(), dtype, measured=measured)


def test_xla_runs_a_direction_only_where_it_was_measured_faster_by_the_margin():
  assert faster(table(1.0, 0.5))
  assert not faster(table(1.0, 1.0 - MARGIN / 2))  # within the spread: our kernel
  assert not faster(table(1.0, 0.5), kernel="wgrad")  # the other directions of the layer were not measured
  assert not faster(table(1.0, 0.5), dtype="float32")  # the table is of 16-bit inputs
  assert not xla_faster("dgrad", (*X[:3], 128), W, 1, 2, 1, "bfloat16", measured=table(1.0, 0.5))  # another stride


def test_a_batch_not_measured_takes_the_nearest_measured_in_ratio():
  both = table(1.0, 0.5, 128) | table(1.0, 2.0, 512)
  assert faster(both, batch=64) and faster(both, batch=250)
  assert not faster(both, batch=260) and not faster(both, batch=4096)


def test_the_shipped_table_holds_times_of_the_three_directions():
  assert MEASURED, "the table is empty: 'auto' would never choose XLA"
  for key, (ours, xla) in MEASURED.items():
    assert key[0] in ("fwd", "dgrad", "wgrad") and len(key) == 11 and ours > 0 and xla > 0, key


@pytest.mark.parametrize("x_shape, w_shape, stride, padding, groups", [
    ((4, 9, 9, 3), (2, 5, 5, 6), 2, 2, 2),  # strided, padded, two groups
    ((3, 8, 7, 5), (3, 3, 3, 4), 1, 1, 1),
])
def test_xla_s_substitutes_compute_what_the_kernels_compute(x_shape, w_shape, stride, padding, groups):
  # Each direction as the kernel computes it (under the interpreter, float32) and as XLA computes it in its place.
  keys = jax.random.split(jax.random.key(0), 4)
  x, w = jax.random.normal(keys[0], x_shape), jax.random.normal(keys[1], w_shape)
  b = jax.random.normal(keys[2], w_shape[-1:])
  geometry = dict(stride=stride, padding=padding, groups=groups, precision="ieee")
  fwd = dict(geometry, relu=True, has_bias=True)
  (y,) = conv_op.CONV_FWD(x, w, b, mode="interpret", **fwd)
  dy = jax.random.normal(keys[3], y.shape)
  pairs = [
      (y, conv_op._fwd_xla(x, w, b, **fwd)[0]),
      (conv_op.CONV_DGRAD(dy, w, mode="interpret", x_shape=x_shape, **geometry)[0],
       conv_op._dgrad_xla(dy, w, x_shape=x_shape, **geometry)[0]),
      (conv_op.CONV_WGRAD(x, dy, mode="interpret", w_shape=w_shape, **geometry)[0],
       conv_op._wgrad_xla(x, dy, w_shape=w_shape, **geometry)[0])]
  for kernel, xla in pairs:
    assert kernel.shape == xla.shape and kernel.dtype == xla.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(xla), np.asarray(kernel), rtol=1e-4, atol=1e-4)


def test_the_table_is_the_measurement_it_names_and_covers_the_layers_measured():
  # scripts/dev/measure_conv_choice.py --print_table of the recorded runs, oldest first and a later run's entries
  # replacing an earlier's, gives the table's entries, time for time; and each run's every config, at its batches,
  # has each conv direction in the table.
  paths = sorted(glob.glob(os.path.join(ROOT, "docs", "results", "conv_choice_*one_h200_*.json")),
                 key=lambda path: path.rsplit("_", 1)[1])
  table, runs = {}, []
  for path in paths:
    printed = subprocess.run([sys.executable, "scripts/dev/measure_conv_choice.py", "--print_table", path], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
    entries = [line.split("#")[0].strip().rstrip(",") for line in printed.splitlines() if line.strip().startswith("(")]
    table.update(ast.literal_eval("{" + ",".join(entries) + "}"))
    with open(path) as f:
      runs += json.load(f)["runs"]
  assert table == MEASURED
  missing = []
  for run in runs:
    config_file, batches = run.rsplit(":", 1)
    config = runpy.run_path(os.path.join(ROOT, config_file))["get_config"]()
    layers = network_table(config, 1000)
    for batch in map(int, batches.split(",")):
      convs = grouped_convs(layers, config.image_size, batch)
      missing += [(config.network, s.name, kernel, batch) for s in convs for kernel in ("fwd", "dgrad", "wgrad")
                  if (kernel != "dgrad" or s is not convs[0])
                  and tile_key(kernel, s.x, s.w, s.stride, s.padding, s.groups) not in MEASURED]
  assert len(paths) == 3 and len(runs) == 8 and not missing, missing
