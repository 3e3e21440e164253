"""Times a one-tower network's train step with our CHWN ops against the same network as plain XLA in NHWC, on one
device: what a JAX user would write (lax.conv_general_dilated on NHWC/HWIO, reduce_window, dot), which XLA hands to
cuDNN and lays out as it likes.

  python scripts/bench_nhwc.py --config configs/vgg16.py [--config.key=value …] [--backends triton,xla]
      [--dtypes bfloat16] [--batches 64,128] [--steps 20] [--windows 5] [--json OUT.json]

Both run the config's table on the same parameters (the NHWC twin's are ours in its layouts, `nhwc_params`; a CPU
test checks that both give the same logits), the same optimiser and the same device-side input (crops, flips,
colour shifts and normalisation of stored-size uint8 batches: `train.model_input` gives NHWC). Steps are timed as
scripts/bench_step.py times them: `--steps` back to back, the median of `--windows` windows. The mesh is cut to
one device (mesh.data = mesh.model = 1). Prints a table; writes the rows as JSON.
"""

import functools
import itertools
import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import optax
from absl import flags
from jax import lax

from alexnet_jax import cli
from alexnet_jax.config import apply_process_settings, validate

cli.define_config("a configs/*.py file of a one-tower network")
flags.DEFINE_list("backends", ["triton", "xla"], "our kernel backends to time beside the NHWC twin")
flags.DEFINE_list("dtypes", ["bfloat16"], "compute dtypes to time")
flags.DEFINE_list("batches", [], "batch sizes to time (default: the config's)")
flags.DEFINE_integer("steps", 20, "steps per timed window")
flags.DEFINE_integer("windows", 5, "timed windows of back-to-back steps")
flags.DEFINE_string("json", None, "write the rows here")


def nhwc_params(table, params, image_size: int) -> dict:
  """Our one-tower parameters in NHWC's layouts: conv kernels HWIO, an fc layer after a map with its rows in
  (H, W, C) order, as an NHWC map flattens."""
  from alexnet_jax.layer_shapes import traced_shapes  # noqa: PLC0415

  if table.towers != 1:
    raise ValueError(f"the NHWC twin runs one-tower tables; this one has {table.towers} towers")
  _, inputs = traced_shapes(table, image_size)
  out = {}
  for layer in table.weighted():
    kernel, bias = params[layer.name]["kernel"][0], params[layer.name]["bias"].reshape(-1)
    if layer.kind == "conv":
      kernel = jnp.transpose(kernel, (1, 2, 0, 3))  # (C, KH, KW, F) → (KH, KW, C, F)
    elif len(inputs[layer.name]) == 4:
      c, h, w, _ = inputs[layer.name]
      kernel = kernel.reshape(c, h, w, -1).transpose(1, 2, 0, 3).reshape(h * w * c, -1)
    out[layer.name] = dict(kernel=kernel, bias=bias)
  return out


def nhwc_apply(table, params, x, *, dtype=jnp.float32, train=False, key=None):
  """Logits (N, classes), float32, of NHWC images; each layer as its CHWN op computes it (float32 accumulation,
  output in `dtype`)."""
  x = x.astype(dtype)
  for layer in table.layers:
    if layer.kind == "conv":
      p = params[layer.name]
      y = lax.conv_general_dilated(x, p["kernel"].astype(dtype), (layer.stride,) * 2, ((layer.padding,) * 2,) * 2,
                                   dimension_numbers=("NHWC", "HWIO", "NHWC"), preferred_element_type=jnp.float32)
      x = _bias_relu(y, p["bias"], layer.relu).astype(dtype)
    elif layer.kind == "pool":
      x = lax.reduce_window(x, -jnp.inf, lax.max, (1, layer.size, layer.size, 1), (1, layer.stride, layer.stride, 1),
                            "VALID")
    elif layer.kind == "lrn":
      a = x.astype(jnp.float32)
      window = lax.reduce_window(a * a, 0.0, lax.add, (1, 1, 1, layer.size), (1,) * 4,
                                 ((0, 0),) * 3 + ((layer.size // 2, (layer.size - 1) // 2),))
      alpha = layer.alpha / layer.size if layer.alpha_over_n else layer.alpha
      x = (a * (layer.k + alpha * window) ** -layer.beta).astype(dtype)
    elif layer.kind == "fc":
      p = params[layer.name]
      y = jnp.dot(x.reshape(x.shape[0], -1), p["kernel"].astype(dtype), preferred_element_type=jnp.float32)
      x = _bias_relu(y, p["bias"], layer.relu).astype(dtype)
    elif layer.kind == "dropout" and train:
      key, sub = jax.random.split(key)
      keep = jax.random.bernoulli(sub, 1 - layer.rate, x.shape)
      x = jnp.where(keep, x / (1 - layer.rate), jnp.zeros_like(x))
  return x.astype(jnp.float32)


def _bias_relu(y, bias, relu):
  y = y + bias.astype(y.dtype)
  return jax.nn.relu(y) if relu else y


def nhwc_train_step(state, batch, key, *, setup, dtype):
  """train.train_step with the NHWC twin as the network."""
  from alexnet_jax import train  # noqa: PLC0415

  key = jax.random.fold_in(key, state.step)

  def loss_fn(params):
    logits = nhwc_apply(setup.net.table, params, train.model_input(setup, batch), dtype=dtype, train=True, key=key)
    return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()

  loss, grads = jax.value_and_grad(loss_fn)(state.params)
  updates, opt_state = setup.tx.update(grads, state.opt_state, state.params)
  return state.replace(step=state.step + 1, params=optax.apply_updates(state.params, updates),
                       opt_state=opt_state), loss


def timed(step, state, batch, key, steps, windows):
  """(median ms per step of back-to-back windows, their spread over the median, the last loss)."""
  for _ in range(3):
    state, out = step(state, batch, key)
  jax.block_until_ready((state, out))
  times = []
  for _ in range(windows):
    t0 = time.perf_counter()
    for _ in range(steps):
      state, out = step(state, batch, key)
    jax.block_until_ready((state, out))
    times.append((time.perf_counter() - t0) / steps)
  ms = statistics.median(times) * 1e3
  loss = out["loss"] / out["count"] if isinstance(out, dict) else out
  return ms, (max(times) - min(times)) * 1e3 / ms, float(loss)


def bench(config, backends, steps, windows) -> list[dict]:
  from alexnet_jax import train  # noqa: PLC0415

  classes = config.dataset.num_classes or 1000
  setup = train.make_setup(config, classes, config.dataset.num_train_examples or 1_281_167)
  state = train.create_train_state(setup, config, jax.random.key(0))
  batch = train.put_batch(setup.mesh, train.random_batch(config.batch_size, config.image_size, classes,
                                                         size=config.dataset.resize))
  key, rows = jax.random.key(1), []
  common = dict(dtype=config.dtype, batch=config.batch_size, image_size=config.image_size, width=config.width,
                device=str(setup.mesh.devices.flat[0].device_kind))
  for backend in backends:
    c = config.copy_and_resolve_references()
    c.kernel_backend = backend
    ours = train.make_setup(c, classes, c.dataset.num_train_examples or 1_281_167)
    step = jax.jit(functools.partial(train.train_step, setup=ours), donate_argnums=0)
    start = train.create_train_state(ours, c, jax.random.key(0))
    ms, spread, loss = timed(step, start, batch, key, steps, windows)
    rows.append(dict(system=f"ours CHWN ({backend})", step_ms=ms, window_spread=spread, loss=loss, **common))
  twin = nhwc_params(setup.net.table, state.params, config.image_size)
  twin_state = train.TrainState(step=state.step, params=twin, opt_state=setup.tx.init(twin))
  step = jax.jit(functools.partial(nhwc_train_step, setup=setup, dtype=jnp.dtype(config.dtype)), donate_argnums=0)
  ms, spread, loss = timed(step, twin_state, batch, key, steps, windows)
  rows.append(dict(system="plain XLA NHWC", step_ms=ms, window_spread=spread, loss=loss, **common))
  for r in rows:
    r["images_per_s"] = r["batch"] / r["step_ms"] * 1e3
  return rows


def main(argv):
  del argv
  args = flags.FLAGS
  config = args.config
  apply_process_settings(config)
  rows = []
  for dtype, batch in itertools.product(args.dtypes, args.batches or [config.batch_size]):
    c = config.copy_and_resolve_references()
    try:
      c.dtype, c.batch_size, c.mesh.data, c.mesh.model = dtype, int(batch), 1, 1
      validate(c)
    except ValueError as e:
      sys.exit(f"error: {e}")
    for row in bench(c, args.backends, args.steps, args.windows):
      rows.append(dict(config=cli.config_name(), **row))
      print(json.dumps(rows[-1]), flush=True)
  print(f"\n{'config':10} {'system':22} {'dtype':9} {'batch':>5} {'ms/step':>8} {'spread':>7} {'img/s':>8}  loss")
  for r in rows:
    print(f"{r['config']:10} {r['system']:22} {r['dtype']:9} {r['batch']:5d} {r['step_ms']:8.2f} "
          f"{r['window_spread']:7.1%} {r['images_per_s']:8.0f}  {r['loss']:.3f}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  cli.run(main, required=["config"])
