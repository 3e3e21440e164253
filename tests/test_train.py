"""Training end to end on two simulated devices: learning, resuming, the files a run leaves, and bad input."""

import functools
import glob
import json
import os
import runpy
import subprocess
import sys

import jax
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from alexnet_jax.config import KEYS, paper_config, validate
from alexnet_jax.data import (DataError, augment, device_augment, device_batches, eval_batches, get_dataset,
                               train_batches)
from alexnet_jax.training import evaluation, guard, loop, restore, step_input, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def first_batch(config, size):
  batch, _ = train_batches(get_dataset(config), size)[0]
  return batch


def demo_config(**changes):
  """The demo's network on 96×96 images: big enough to learn, small enough for CI."""
  c = paper_config()
  c.width, c.image_size, c.weight_init = 0.25, 96, "he"
  c.dataset.name, c.dataset.num_classes = "procedural", 10
  c.dataset.num_train_examples, c.dataset.num_eval_examples = 3200, 200
  c.batch_size, c.eval_batch_size, c.learning_rate = 32, 100, 0.02
  c.num_epochs, c.lr_drop_epochs = 1.0, (0.8,)
  c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 25, 50, 50
  c.update(changes)
  return c


@pytest.fixture
def demo_run(once):
  return once("train_demo_run", lambda workdir: jax.tree.map(float, loop.train_and_evaluate(demo_config(), workdir)))


def test_short_demo_run_beats_chance(demo_run):
  _, metrics = demo_run
  # Chance: top-1 0.10, top-5 0.50, loss ln 10 = 2.30; this run (100 steps) reached 0.28, 0.92 and 1.70.
  assert metrics["top1"] > 0.18
  assert metrics["top5"] > 0.75
  assert metrics["loss"] < 2.05


def test_run_leaves_tensorboard_and_jsonl_metrics(demo_run):
  workdir, metrics = demo_run
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  evals = [r for r in rows if r["split"] == "eval"]
  assert [r["step"] for r in evals] == [50, 100]
  assert evals[-1]["top1"] == pytest.approx(metrics["top1"])
  train_rows = [r for r in rows if r["split"] == "train"]
  assert train_rows[-1]["loss"] < train_rows[0]["loss"]
  # A healthy run leaves chance within its first steps (this one after 50-odd), and is never said to have stalled.
  assert max(r["steps_at_chance"] for r in train_rows) < guard.STALL_STEPS
  assert not [r for r in rows if r["split"] == "note"]
  events = EventAccumulator(os.path.join(workdir, "tensorboard"))
  events.Reload()
  assert {"train/loss", "train/top1", "train/learning_rate", "eval/top1", "eval/top5"} <= set(events.Tags()["scalars"])
  assert [e.step for e in events.Scalars("eval/top1")] == [50, 100]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["100", "50"]
  assert {"curves.png", "conv1_filters.png"} <= set(os.listdir(workdir))


def steps_on_one_batch(setup, config, state, steps=4):
  """(state, per-example losses) after `steps` train steps on the first batch of 16."""
  batch = setup.batch_layout.put(first_batch(config, 16))
  step = jax.jit(functools.partial(train.train_step, setup=setup))
  losses = []
  for _ in range(steps):
    state, m = step(state, batch, jax.random.key(1))
    losses.append(float(m["loss"]) / float(m["count"]))
  return state, losses


def test_train_step_lowers_the_loss_on_a_fixed_batch():
  config = demo_config(batch_size=16, image_size=64)
  setup = train.make_setup(config, 10, 4800)
  state = train.create_train_state(setup, jax.random.key(0))
  state, losses = steps_on_one_batch(setup, config, state)
  assert losses[-1] < losses[0] - 0.1, losses
  assert int(state.step) == 4


def test_bfloat16_compute_keeps_float32_parameters():
  losses = {}
  for dtype in ("float32", "bfloat16"):
    config = demo_config(batch_size=8, dtype=dtype, image_size=64)
    setup = train.make_setup(config, 10, 4800)
    state = train.create_train_state(setup, jax.random.key(0))
    batch = setup.batch_layout.put(first_batch(config, 8))
    state, m = jax.jit(functools.partial(train.train_step, setup=setup))(state, batch, jax.random.key(1))
    assert all(p.dtype == np.float32 for p in jax.tree.leaves(state.params))
    losses[dtype] = float(m["loss"]) / 8
  assert np.isfinite(losses["bfloat16"])
  assert losses["bfloat16"] == pytest.approx(losses["float32"], rel=0.05)


def small_run(**changes):
  """A run of the demo's network that saves after a step or two."""
  config = demo_config(image_size=64, **changes)
  config.dataset.num_train_examples, config.dataset.num_eval_examples = 160, 20
  return config


def test_checkpoint_of_another_network_or_input_order_is_refused(tmp_path):
  loop.train_and_evaluate(small_run(batch_size=8, num_epochs=0.05), str(tmp_path))
  # Two weights that differ are named, then how many more: not one weight and its momentum.
  with pytest.raises(ValueError, match=r"does not fit this configuration \(params.conv1.bias: checkpoint \(2, 12\) vs "
                     r"config \(2, 24\); params.conv1.kernel: .*; \d+ more\)"):
    loop.train_and_evaluate(small_run(batch_size=8, num_epochs=0.1, width=0.5), str(tmp_path))
  # Same network, but batch i would now hold other examples: resuming would repeat and skip data.
  with pytest.raises(DataError, match="input position does not fit this run .batch_size 8 → 16"):
    loop.train_and_evaluate(small_run(batch_size=16, num_epochs=0.1), str(tmp_path))


CUSTOM_NETWORK_CONFIG = """
from alexnet_jax.network import table
from alexnet_jax.config import paper_config
from alexnet_jax.network.table import Layer, Table


@table.register("tiny_test_net")
def tiny(*, num_classes, width, towers, lrn_alpha_over_n):
  return Table((
      Layer("conv1", "conv", filters=round(16 * width), size=5, stride=2),
      Layer("norm1", "lrn", size=3, k=1.0, alpha=1e-3, beta=0.75, alpha_over_n=lrn_alpha_over_n),
      Layer("pool1", "pool", size=3, stride=2),
      Layer("fc2", "fc", filters=num_classes, split="sum", relu=False)), towers)


def get_config():
  c = paper_config()
  c.network, c.weight_init, c.image_size, c.batch_size, c.learning_rate = "tiny_test_net", "he", 32, 16, 0.02
  c.dataset.name, c.dataset.num_classes, c.dataset.num_train_examples = "procedural", 10, 320
  return c
"""


def test_a_config_file_can_define_and_register_its_own_network(tmp_path):
  path = tmp_path / "tiny.py"
  path.write_text(CUSTOM_NETWORK_CONFIG)
  config = validate(runpy.run_path(str(path))["get_config"]())
  setup = train.make_setup(config, 10, 320)
  assert [layer.name for layer in setup.net.table.layers] == ["conv1", "norm1", "pool1", "fc2"]
  state = train.create_train_state(setup, jax.random.key(0))
  assert state.params["conv1"]["kernel"].shape == (2, 3, 5, 5, 8)
  assert len(state.params["conv1"]["kernel"].sharding.device_set) == 2  # a tower per device
  state, losses = steps_on_one_batch(setup, config, state)
  assert losses[-1] < losses[0], losses
  runpy.run_path(str(path))  # loading the config file again (as each script does) re-registers the same network


def test_metrics_count_top1_and_top5_hits_on_known_logits():
  logits = np.array([[9, 8, 7, 6, 5, 4, 0], [0, 1, 2, 3, 4, 5, 6], [1, 1, 1, 1, 1, 1, 9]], np.float32)
  labels = np.array([0, 1, 2])  # ranks 1, 6 and 4 (top_k breaks ties by index: 6, 0, 1, 2, 3)
  m = jax.device_get(train.metrics_of(logits, labels, np.array([True, True, True])))
  assert (m["top1"], m["top5"], m["count"]) == (1, 2, 3)
  m = jax.device_get(train.metrics_of(logits, labels, np.array([True, False, False])))
  assert (m["top1"], m["top5"], m["count"]) == (1, 1, 1)
  np.testing.assert_allclose(m["loss"], -jax.nn.log_softmax(logits[0])[0], rtol=1e-6)


@pytest.mark.parametrize("backend, gather_input", [("xla", False), ("interpret", False), ("interpret", True)])
def test_model_input_crops_flips_shifts_and_normalises_as_the_numpy_reference(backend, gather_input):
  # XLA's input, and the input kernel (under the interpreter) on each device's rows: the whole batch on both towers,
  # or each device its own rows, placed for the towers first (config.gather_input).
  config = demo_config(kernel_backend=backend, gather_input=gather_input)
  setup = train.make_setup(config, 10, 4800, mean=(0.4, 0.5, 0.6), std=(0.2, 0.25, 0.3))
  batch = device_batches.random_batch(6, 96, 10, seed=2, size=110)
  batch["shift"] = np.random.default_rng(3).normal(0, 0.02, (6, 3)).astype(np.float32)
  assert 0 < batch["flip"].sum() < 6 and batch["offset"].max() > 0
  got = jax.jit(functools.partial(step_input.model_input, setup))(setup.batch_layout.put(batch))
  crops = np.stack([augment.crop_flip(x, *offset, flip, 96) for x, offset, flip
                    in zip(batch["image"], batch["offset"], batch["flip"])])
  expected = (crops / 255 + batch["shift"][:, None, None] - [0.4, 0.5, 0.6]) / [0.2, 0.25, 0.3]
  assert got.shape == (6, 96, 96, 3) and got.dtype == np.float32
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_ten_crop_evaluation_averages_the_crops_softmax():
  config = demo_config(batch_size=8)
  setup = train.make_setup(config, 10, 4800)
  state = train.create_train_state(setup, jax.random.key(0))
  images = np.random.default_rng(0).integers(0, 256, (4, 104, 104, 3), np.uint8)  # stored larger than the crop
  batch = dict(image=images, label=np.array([0, 1, 2, 3], np.int32), mask=np.array([True] * 3 + [False]))
  p_eval_step = jax.jit(functools.partial(train.eval_step, setup=setup), static_argnames="crops")
  forward = jax.jit(train.logits_fn(setup), static_argnums=3)  # one program, not one per operation
  m = p_eval_step(state, setup.batch_layout.put(batch), crops=10)
  crops = np.concatenate([augment.ten_crops(x, 96) for x in images])  # the numpy reference, on the host
  images = device_augment.normalise(crops, None, setup.mean, setup.std)
  logits = forward(state.params, images, jax.random.key(0), False)
  probs = np.asarray(jax.nn.softmax(logits)).reshape(4, 10, 10).mean(1)[:3]
  expected_top1 = (probs.argmax(-1) == [0, 1, 2]).sum()
  assert int(m["count"]) == 3 and int(m["top1"]) == expected_top1
  np.testing.assert_allclose(float(m["loss"]), -np.log(probs[[0, 1, 2], [0, 1, 2]]).sum(), rtol=1e-4)
  centre = p_eval_step(state, setup.batch_layout.put(batch), crops=1)
  images = device_augment.normalise(crops[4::10], None, setup.mean, setup.std)
  logits = forward(state.params, images, jax.random.key(0), False)
  np.testing.assert_allclose(float(centre["loss"]), float(train.metrics_of(logits, batch["label"], batch["mask"])
                                                           ["loss"]), rtol=1e-5)
  five = p_eval_step(state, setup.batch_layout.put(batch), crops=5)  # the unmirrored crops: the first five of ten
  images = device_augment.normalise(np.concatenate([c[:5] for c in crops.reshape(4, 10, 96, 96, 3)]), None,
                                    setup.mean, setup.std)
  probs = np.asarray(jax.nn.softmax(forward(state.params, images, jax.random.key(0), False))).reshape(4, 5, 10)
  np.testing.assert_allclose(float(five["loss"]), -np.log(probs.mean(1)[[0, 1, 2], [0, 1, 2]]).sum(), rtol=1e-4)
  with pytest.raises(ValueError, match="crops must be 1 .centre., 5 .corners and centre. or 10"):
    p_eval_step(state, setup.batch_layout.put(batch), crops=3)


def test_many_crop_evaluation_mirrors_only_what_training_mirrored():
  assert train.multi_crop(demo_config()) == 5  # the procedural set is never mirrored
  config = paper_config()
  assert train.multi_crop(config) == 10
  config.dataset.flip = False
  assert train.multi_crop(config) == 5


def test_evaluate_checkpoint_reports_centre_and_ten_crop_metrics(demo_run):
  workdir, metrics = demo_run
  config = demo_config()
  step, results = evaluation.evaluate_checkpoint(workdir, crops=(1, 10))  # the run's own config (run.json)
  assert step == 100 and set(results) == {1, 10}
  assert results[1] == pytest.approx(metrics | dict(count=200))  # the centre crop is the training run's eval
  # The ten crops' metrics from the checkpoint's logits of every crop, their softmax averaged here.
  _, setup, state = restore.restore_newest(workdir)
  dataset = get_dataset(config)
  logits = jax.jit(lambda images: train.logits_fn(setup)(state.params, images, jax.random.key(0), False))
  probs, labels = [], []
  for batch in eval_batches(dataset, config.eval_batch_size):
    ten = np.stack([augment.ten_crops(x, config.image_size) for x in batch["image"]])
    images = device_augment.normalise(ten, None, setup.mean, setup.std)
    n = images.shape[0]
    crops = np.asarray(jax.nn.softmax(logits(images.reshape(n * 10, *images.shape[2:])))).reshape(n, 10, -1)
    probs.append(crops.mean(1)[batch["mask"]])
    labels.append(batch["label"][batch["mask"]])
  probs, labels = np.concatenate(probs), np.concatenate(labels)
  ranks = (probs > probs[np.arange(len(labels)), labels][:, None]).sum(1)  # classes scored above the label
  assert results[10]["count"] == len(labels) == 200
  assert results[10]["top1"] == pytest.approx(np.mean(ranks == 0))
  assert results[10]["top5"] == pytest.approx(np.mean(ranks < 5))
  assert results[10]["loss"] == pytest.approx(-np.log(probs[np.arange(200), labels]).mean(), rel=1e-4)


def test_bad_config_and_input_get_one_clear_error():
  # paper_config() is locked: a mistyped key is refused where it is set, with the key it was probably meant to be.
  with pytest.raises(AttributeError, match='(?s)"lerning_rate" does not exist.*Did you mean "learning_rate"'):
    demo_config().lerning_rate = 0.1
  with pytest.raises(AttributeError, match='(?s)"nme" does not exist.*Did you mean "name"'):
    demo_config().dataset.nme = "folder"
  with pytest.raises(ValueError, match="config.network must be one of 'alexnet'.*got 'lenet'"):
    validate(demo_config(network="lenet"))
  with pytest.raises(ValueError, match="config.dtype"):
    validate(demo_config(dtype="float8"))
  config = demo_config()
  config.dataset.gpu_backends = "cuda"
  with pytest.raises(ValueError, match="config.dataset.gpu_backends must be one of 'all', 'hardware', got 'cuda'"):
    validate(config)
  batch = device_batches.random_batch(2, 96, 10, size=104)
  device_batches.check_batch(batch, 104, 96)
  with pytest.raises(ValueError, match=r"expected a batch of image \(2, 110, 110, 3\) uint8, offset \(2, 2\) int32, "
                     r"flip \(2,\) bool, shift \(2, 3\) float32, label \(2,\) int32; got image \(2, 104, 104, 3\)"):
    device_batches.check_batch(batch, 110, 96)
  with pytest.raises(ValueError, match=r"got image \(2, 104, 104, 3\) float32"):
    device_batches.check_batch(batch | dict(image=batch["image"].astype(np.float32)), 104, 96)
  with pytest.raises(ValueError, match=r"; got image \(2, 104, 104, 3\) uint8, offset \(2, 2\) int32, shift"):
    device_batches.check_batch({k: v for k, v in batch.items() if k != "flip"}, 104, 96)
  with pytest.raises(ValueError, match=r"crop offsets must lie in \[0, 8\] .* got 0..9"):
    device_batches.check_batch(batch | dict(offset=np.array([[0, 9], [3, 3]], np.int32)), 104, 96)
  with pytest.raises(ValueError, match="needs 4 devices"):
    train.make_setup(demo_config(mesh=dict(model=2, data=2)), 10, 100)


@pytest.mark.parametrize("flag,message", [
    ("--config.dataset.name=nope", "error: tensorflow-datasets has no dataset 'nope'"),
    ("--config.lerning_rate=0.1", "lerning_rate"),
])
def test_command_line_reports_bad_input_in_one_line(tmp_path, flag, message):
  run = subprocess.run([sys.executable, "scripts/train.py", "--config", "configs/demo.py", flag,
                        "--workdir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode != 0
  assert message in run.stderr
  assert "Traceback" not in run.stderr


@pytest.mark.parametrize("script,others", [  # a config file, or (the scripts that read a run) its run.json
    ("train.py", ["--config", "configs/demo.py", "--workdir", "WORKDIR"]), ("evaluate.py", ["--workdir", "RUN"]),
    ("visualize.py", ["--workdir", "RUN"]), ("export.py", ["--workdir", "RUN", "--out", "WORKDIR/x"]),
    ("benchmark.py", ["--config", "configs/demo.py"]), ("dev/profile_step.py", ["--config", "configs/demo.py"]),
    ("dev/verify_kernels.py", ["--config", "configs/demo.py"]),
])
def test_every_script_reports_a_mistyped_config_key_in_one_line(tmp_path, demo_run, script, others):
  args = [a.replace("WORKDIR", str(tmp_path)).replace("RUN", demo_run[0]) for a in others]
  run = subprocess.run([sys.executable, f"scripts/{script}", *args, "--config.lerning_rate=0.1"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode != 0
  assert run.stderr.strip().splitlines()[-1].startswith("error: bad flag: ")
  assert "lerning_rate" in run.stderr and "Traceback" not in run.stderr


def test_learning_rate_schedules_beside_the_paper_s():
  config = demo_config(learning_rate=0.1, lr_drop_epochs=(1.0,), warmup_epochs=0.5)
  rates = train.learning_rates(config, steps_per_epoch=10, total_steps=20)
  assert [round(float(rates(s)), 6) for s in (0, 4, 5, 9, 10, 19)] == [0.02, 0.1, 0.1, 0.1, 0.01, 0.01]
  config.lr_schedule, config.warmup_epochs = "cosine", 0.0
  rates = train.learning_rates(config, steps_per_epoch=10, total_steps=20)
  assert [round(float(rates(s)), 6) for s in (0, 10, 20)] == [0.1, 0.05, 0.0]
  with pytest.raises(ValueError, match="must stay within 2,147,483,647 steps"):
    train.make_setup(demo_config(lr_drop_epochs=(1e6,)), 10, 10**8)


def test_a_run_measured_in_steps_keeps_its_length_and_warm_up_whatever_the_dataset():
  config = demo_config(num_steps=120, warmup_steps=12, lr_schedule="cosine", learning_rate=0.1)
  for num_train in (96, 3200, 10**6):  # 3, 100 and 31,250 steps an epoch
    setup = train.make_setup(config, 10, num_train)
    assert setup.total_steps == 120
    cosine = lambda s: 0.05 * (1 + np.cos(np.pi * s / 120))  # noqa: E731
    expected = [cosine(0) / 12, cosine(11), cosine(12), 0.0]  # warming up to step 12, then the cosine alone
    np.testing.assert_allclose([float(setup.schedule(s)) for s in (0, 11, 12, 120)], expected, atol=1e-7)
  assert train.make_setup(demo_config(num_epochs=2.0), 10, 3200).total_steps == 200  # num_steps 0: the epochs


def test_label_smoothing_spreads_the_targets():
  # fc8's bias gradient is the batch's mean of softmax − target: with smoothing α the target is (1 − α)·onehot + α/C.
  config = demo_config(batch_size=8, label_smoothing=0.1, weight_decay=0.0, momentum=0.0, image_size=64)
  setup = train.make_setup(config, 10, 4800)
  state = train.create_train_state(setup, jax.random.key(0))
  batch = setup.batch_layout.put(first_batch(config, 8))
  key = jax.random.key(1)
  new, _ = jax.jit(functools.partial(train.train_step, setup=setup))(state, batch, key)
  logits = jax.jit(train.logits_fn(setup), static_argnums=3)(state.params, step_input.model_input(setup, batch),
                                                             jax.random.fold_in(key, 0), True)
  targets = 0.9 * jax.nn.one_hot(batch["label"], 10) + 0.1 / 10
  want = np.asarray(jax.nn.softmax(logits) - targets).mean(0)
  got = (np.asarray(state.params["fc8"]["bias"]) - np.asarray(new.params["fc8"]["bias"])) / config.learning_rate
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_the_python_page_runs_as_written(tmp_path):
  page = open(os.path.join(ROOT, "docs", "python.md")).read()
  code = page.split("```python\n", 1)[1].split("```", 1)[0]
  run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  assert run.returncode == 0, run.stderr[-3000:]
  lines = run.stdout.splitlines()[run.stdout.splitlines().index(next(
      line for line in run.stdout.splitlines() if line.startswith("held-out top-1 "))):]  # training's own lines before
  assert lines[1].startswith("10 classes: grating_") and len(lines) == 7  # and a line per image
  assert lines[-1].startswith("{'loss': ") and "'count': 200" in lines[-1]


def test_help_names_the_config_and_show_config_lists_every_key():
  run = subprocess.run([sys.executable, "scripts/train.py", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert run.returncode == 0 and "--config: a configs/*.py file" in run.stdout and "--[no]show_config" in run.stdout
  run = subprocess.run([sys.executable, "scripts/train.py", "--config", "configs/demo.py", "--config.width=0.5",
                        "--show_config"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  assert "width                      = 0.5" in run.stdout and "a number in [0.001, 64]: scales" in run.stdout
  assert len(run.stdout.splitlines()) == 2 * len(KEYS)


@pytest.mark.parametrize("script", sorted(os.path.relpath(p, os.path.join(ROOT, "scripts")) for p in
                                    glob.glob(os.path.join(ROOT, "scripts", "**", "*.py"), recursive=True)))
def test_every_script_answers_help_with_its_flags_and_status_0(script):
  run = subprocess.run([sys.executable, os.path.join("scripts", script), "--help"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert run.returncode == 0 and "--" in run.stdout and not run.stderr.strip(), run.stdout[-1000:] + run.stderr[-2000:]


def test_simulated_devices_get_threads_enough_for_their_collectives():
  # Each device's part of a step waits for the other's in one of XLA:CPU's threads at every collective: with a
  # thread per core on two cores, a run of the paper's split ended after 40 s in an all-gather ("only 1 of them
  # arrived"). The scripts' process settings give XLA:CPU (which reads NPROC) threads to spare.
  code = ("import os; from alexnet_jax.config import apply_process_settings, paper_config; c = paper_config(); "
          "c.cpu_devices = 2; apply_process_settings(c); import jax; jax.devices(); print(os.environ['NPROC'])")
  env = {k: v for k, v in os.environ.items() if k != "NPROC"}
  run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr[-2000:]
  assert int(run.stdout.strip()) >= 8
