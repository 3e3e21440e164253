"""Portable artifacts (alexnet_jax/export.py, scripts/export.py): the inference function and the train step exported
for CPU and TPU on this CPU host, serialised, loaded and run here, equal to the live model — on one device for a
batch of any size (the default), or on the run's two; what an artifact says of itself, and a damaged one refused (its
header edited, its payload no program, class names that are not one per logit, an earlier format included); a
bfloat16 TPU export that carries none of the CPU's workarounds, and a bfloat16 step exported for CPU and TPU at once
that runs here; the refusals, in one line."""

import functools
import hashlib
import itertools
import json
import os
import re
import runpy
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest
from PIL import Image

from alexnet_jax import export
from alexnet_jax.data import eval_batches, get_dataset, procedural, train_batches
from alexnet_jax.network import sharding
from alexnet_jax.training import checkpoints, loop, step_input, train
from alexnet_jax.training import run as run_files

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
  training's own code, with its run.json: (workdir, config, setup, state)."""
  workdir = str(tmp_path_factory.mktemp("run"))
  config = demo_config()
  dataset = get_dataset(config)
  setup = train.dataset_setup(config, dataset)
  state = train.create_train_state(setup, jax.random.key(config.seed))
  state = state.replace(params=jax.tree.map(lambda p: 1.5 * p, state.params))
  described = run_files.describe(config, dataset, setup.net.table)
  run_files.write(workdir, described)
  manager = checkpoints.manager(workdir, config)
  checkpoints.save(manager, 1, state, loop.data_position(config, dataset, 1), described)
  manager.wait_until_finished()
  return workdir, config, setup, state


def live_logits(setup, state, images):
  forward = jax.jit(train.logits_fn(setup), static_argnums=3)  # one program, not one per operation
  return forward(state.params, step_input.eval_input(setup, images), jax.random.key(0), False)


def test_script_exports_inference_on_one_device_for_any_batch_that_runs_here_like_the_live_model(run, tmp_path):
  workdir, config, setup, state = run
  out = str(tmp_path / "model.jaxexport")
  done = subprocess.run([sys.executable, "scripts/export.py", "--workdir", workdir, "--platforms", "cpu,tpu",
                         "--out", out], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  assert "logits for cpu, tpu on 1 device(s): (uint8[batch, 64, 64, 3]) → (float32[batch, 10])" in done.stdout
  loaded = export.load(out)
  assert loaded.classes == procedural.CLASS_NAMES and loaded.facts["size"] == 64
  assert loaded.facts["step"] == int(state.step)
  assert loaded.facts["mean"] == pytest.approx(np.asarray(get_dataset(config).statistics.mean).tolist())
  images = np.concatenate([b["image"] for b in itertools.islice(eval_batches(get_dataset(config), 4), 2)])[:7]
  assert_same(loaded.exported.call(images), live_logits(setup, state, images))  # 7 images: any batch


@pytest.fixture(scope="module")
def artifact(run, tmp_path_factory):
  """The run's default artifact, as `scripts/export.py --workdir W --out F` writes it: what the tests that read an
  artifact share."""
  out = str(tmp_path_factory.mktemp("artifact") / "model.jaxexport")
  subprocess.run([sys.executable, "scripts/export.py", "--workdir", run[0], "--out", out], cwd=ROOT, check=True,
                 capture_output=True, timeout=300)
  return out


def test_predict_classifies_image_files_with_an_artifact_as_with_its_run(run, artifact, tmp_path):
  workdir, _, _, _ = run
  out = artifact
  for i, shape in enumerate(((80, 100, 3), (64, 64))):  # any size, colour or grey
    Image.fromarray(np.random.default_rng(i).integers(0, 256, shape, np.uint8)).save(tmp_path / f"{i}.png")
  outputs = [subprocess.run([sys.executable, "scripts/predict.py", *source, str(tmp_path), "--top=3"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300) for source in (["--artifact", out],
                                                                                        ["--workdir", workdir])]
  assert all(o.returncode == 0 for o in outputs), [o.stderr[-2000:] for o in outputs]
  by_artifact, by_run = ([line.split(": ") for line in o.stdout.strip().splitlines()] for o in outputs)
  assert [p for p, _ in by_artifact] == [str(tmp_path / f"{i}.png") for i in range(2)]
  for (_, a), (_, r) in zip(by_artifact, by_run):  # the same classes, the same probabilities to 3 decimals
    assert a == r and len(a.split(", ")) == 3 and a.split()[0] in procedural.CLASS_NAMES


def test_a_damaged_artifact_is_refused_in_one_line(artifact, tmp_path):
  with open(artifact, "rb") as f:
    data = f.read()
  damaged = {"flipped": data[:-100] + bytes(b ^ 0xFF for b in data[-100:-36]) + data[-36:],
             "truncated": data[: len(data) // 2], "empty": b"", "garbage": os.urandom(1000)}
  for name, content in damaged.items():
    path = tmp_path / f"{name}.jaxexport"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"{path} (is damaged|is not an alexnet_jax artifact)"):
      export.load(str(path))
  with pytest.raises(ValueError, match=f"cannot read {tmp_path}/missing.jaxexport"):
    export.load(str(tmp_path / "missing.jaxexport"))


def parts(path) -> tuple[dict, bytes]:
  """(header, payload) of the artifact file at `path`."""
  data = open(path, "rb").read()
  end = data.index(b"\n", len(export.MAGIC))
  return json.loads(data[len(export.MAGIC):end]), data[end + 1:]


def artifact_file(path, header: dict, payload: bytes) -> str:
  """A file laid out as an artifact: MAGIC, `header` as one line of JSON (as given: sealed or not), `payload`."""
  path.write_bytes(export.MAGIC + json.dumps(header).encode() + b"\n" + payload)
  return str(path)


def sealed(header: dict, payload: bytes) -> dict:
  """`header` with the length and digest that `payload` and it call for: what anyone who knows the format can
  write, unlike a mistaken edit."""
  header = dict(header, payload_bytes=len(payload))
  return dict(header, sha256=export.digest(header, payload))


def refused(path: str) -> str:
  with pytest.raises(ValueError) as e:
    export.load(path)
  assert "\n" not in str(e.value)
  return str(e.value)


def test_an_edited_header_is_refused_and_an_artifact_of_format_1_is_told_to_be_exported_again(artifact, tmp_path):
  header, payload = parts(artifact)
  edited = dict(header, classes=["cat", *header["classes"][1:]])  # the payload's length and digest kept
  path = artifact_file(tmp_path / "edited.jaxexport", edited, payload)
  assert refused(path).startswith(f"{path} is damaged: its header or program is not what it was written with")
  old = dict(edited, format=1, sha256=hashlib.sha256(payload).hexdigest())  # format 1 sealed the payload alone
  path = artifact_file(tmp_path / "old.jaxexport", old, payload)
  assert refused(path) == (f"{path} is an artifact of format 1, this package reads format 2 (its digest covers the "
                           "header too): export it again with scripts/export.py")
  assert export.load(artifact_file(tmp_path / "same.jaxexport", header, payload)).classes == procedural.CLASS_NAMES


def test_a_header_naming_more_classes_than_the_program_gives_logits_is_refused(artifact, tmp_path):
  config = demo_config()
  config.mesh.model = 1
  setup = train.make_setup(config, 4, 200)
  exported = export.export_inference(setup, train.create_train_state(setup, jax.random.key(0)).params,
                                     platforms=["cpu"])
  header, _ = parts(artifact)  # the ten procedural classes
  wrong = "its header names 10 classes for a program whose output is (float32[batch, 4])"
  with pytest.raises(ValueError, match=re.escape(f"cannot export to {tmp_path}/four.jaxexport: {wrong}")):
    export.save(exported, str(tmp_path / "four.jaxexport"), {k: header[k] for k in ("classes", "size", "input")})
  assert not os.listdir(tmp_path)
  path = artifact_file(tmp_path / "four.jaxexport", sealed(header, exported.serialize()), exported.serialize())
  assert refused(path) == f"{path} is damaged: {wrong}; export it again"


def test_a_payload_that_is_no_program_is_refused_in_one_line_even_under_a_correct_digest(artifact, tmp_path):
  header, _ = parts(artifact)
  for seed, size in enumerate((0, 7, 20_000)):
    payload = np.random.default_rng(seed).bytes(size)
    path = artifact_file(tmp_path / f"random{seed}.jaxexport", sealed(header, payload), payload)
    assert refused(path).startswith(f"{path} is not an artifact or is damaged: its program cannot be read by this "
                                    "JAX (")
  Image.fromarray(np.zeros((64, 64, 3), np.uint8)).save(tmp_path / "a.png")
  done = subprocess.run([sys.executable, "scripts/predict.py", "--artifact", path, str(tmp_path / "a.png")],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
  assert done.stderr.strip().splitlines()[-1].startswith(f"error: {path} is not an artifact or is damaged")


def test_an_artifact_on_the_run_s_two_devices(run, tmp_path):
  workdir, _, setup, state = run
  out = str(tmp_path / "model.jaxexport")
  done = subprocess.run([sys.executable, "scripts/export.py", "--workdir", workdir, "--mesh", "run", "--batch", "4",
                         "--out", out], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr
  loaded = export.load(out).exported
  assert loaded.nr_devices == 2
  images = np.random.default_rng(0).integers(0, 256, (4, 64, 64, 3), np.uint8)
  assert_same(loaded.call(jax.device_put(images, loaded.in_shardings_jax(setup.mesh)[0])),
              live_logits(setup, state, images))


def test_inference_of_normalised_chwn_crops(run):
  _, config, setup, state = run
  exported = export.export_inference(setup, state.params, platforms=["cpu", "tpu"], batch_size=4,
                                     input_kind="chwn")
  loaded = jax.export.deserialize(exported.serialize())
  images = jax.random.normal(jax.random.key(1), (3, 64, 64, 4))
  live = jax.jit(sharding.sharded_apply(setup.net, setup.mesh), static_argnums=3)(state.params, images,
                                                                                  jax.random.key(0), False)
  assert_same(loaded.call(jax.device_put(images, loaded.in_shardings_jax(setup.mesh)[0])), live)


def test_train_step_exported_for_cpu_and_tpu_runs_here_like_the_live_step(run):
  _, config, setup, state = run
  exported = export.export_train_step(setup, platforms=["cpu", "tpu"], batch_size=4)
  loaded = jax.export.deserialize(exported.serialize())  # TrainState and optax's states: registered by the module
  batch = setup.batch_layout.put(train_batches(get_dataset(config), 4)[0][0])
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


def test_bfloat16_train_step_exported_for_cpu_and_tpu_runs_here():
  # XLA:CPU compiles every platform's branch of such a program, and aborts on a bf16 reduce-scatter in any: an
  # artifact for the CPU and others reduce-scatters in float32 on all of them.
  config = demo_config(dtype="bfloat16")
  setup = train.make_setup(config, 10, 200)
  state = train.create_train_state(setup, jax.random.key(0))
  exported = export.export_train_step(setup, platforms=["cpu", "tpu"], batch_size=4)
  batch = setup.batch_layout.put(train_batches(get_dataset(config), 4)[0][0])
  new_state, metrics = jax.export.deserialize(exported.serialize()).call(state, batch, jax.random.key(0))
  assert int(new_state.step) == 1 and np.isfinite(float(metrics["loss"]))


def test_refusals_are_one_clear_line(run):
  with pytest.raises(ValueError, match="export platforms must be some of cpu, cuda, rocm, tpu; got gpu"):
    export.check_platforms(["gpu"], "auto")
  with pytest.raises(ValueError, match="'interpret' runs the kernels in host callbacks"):
    export.check_platforms(["cpu"], "interpret")
  assert export.check_platforms(["cpu", "cuda"], "xla") == ("cpu", "cuda")  # XLA's own ops lower for CUDA anywhere
  done = subprocess.run([sys.executable, "scripts/export.py", "--workdir", run[0], "--function", "train_step",
                         "--platforms", "cpu,cuda", "--out", "unused.jaxexport"],
                        cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert done.returncode != 0 and "Traceback" not in done.stderr
  assert done.stderr.strip().splitlines()[-1].startswith(
      "error: exporting the Triton kernels for cuda needs a CUDA GPU here")
  assert not os.path.exists(os.path.join(ROOT, "unused.jaxexport"))


def test_the_loading_snippet_of_the_export_page_runs_on_a_one_device_host(artifact, tmp_path):
  shutil.copy(artifact, tmp_path / "demo.jaxexport")  # the name the page loads
  page = open(os.path.join(ROOT, "docs", "export.md")).read()
  code = page.split("```python\n", 1)[1].split("```", 1)[0]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"} | dict(PYTHONPATH=ROOT)  # JAX's own defaults
  done = subprocess.run([sys.executable, "-c", "import jax; assert jax.device_count() == 1\n" + code], cwd=tmp_path,
                        capture_output=True, text=True, timeout=300, env=env)
  assert done.returncode == 0, done.stderr[-3000:]
  names = eval(done.stdout.strip().splitlines()[-1])  # noqa: S307  (the snippet prints a list of class names)
  assert len(names) == 3 and set(names) <= set(procedural.CLASS_NAMES)
