"""Runs of two processes on 127.0.0.1 (CPU devices, gloo collectives), one device each, through the documented
launch line, stopped halfway and resumed: for each strategy the parameters of an uninterrupted process with two
devices (every strategy computes the same function: the tower run stands for all), metrics written once, every
evaluation example counted once, and pictures of filters held on the other process."""

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import portpicker
import pytest

from alexnet_jax.training import checkpoints, distributed, loop, train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = dict(width=0.0625, image_size=64, batch_size=8, eval_batch_size=10, num_epochs=1.0, log_every_steps=2,
            eval_every_steps=6, checkpoint_every_steps=3)
DATA = dict(num_train_examples=48, num_eval_examples=15)  # 6 steps; evaluation's second batch is padded
STRATEGIES = {"tower": dict(strategy="tower", mesh=dict(model=2, data=1)),
              "data": dict(strategy="data", mesh=dict(model=1, data=2)),
              "hybrid": dict(strategy="hybrid", mesh=dict(model=2, data=1))}


def demo_config(strategy: str):
  spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "configs", "demo.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config()
  config.update(TINY | STRATEGIES[strategy])
  config.dataset.update(DATA)
  return config


def flags_of(config) -> list[str]:
  """The command-line overrides that make configs/demo.py this config."""
  changes = TINY | {f"dataset.{k}": v for k, v in DATA.items()} | {"strategy": config.strategy}
  changes |= {f"mesh.{k}": v for k, v in config.mesh.items()}
  return [f"--config.{k}={v}" for k, v in changes.items()]


def start_two_processes(config, workdir: str, *flags: str) -> list[subprocess.Popen]:
  """Starts training `config` (with further command-line flags) in two processes, one CPU device each."""
  address = f"127.0.0.1:{portpicker.pick_unused_port()}"
  env = dict(os.environ, PYTHONPATH=ROOT, TRITON_INTERPRET="1")
  return [subprocess.Popen([sys.executable, "scripts/train.py", "--config", "configs/demo.py", f"--workdir={workdir}",
                            *flags_of(config), *flags, f"--config.distributed.coordinator={address}",
                            "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}"],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for i in range(2)]


def two_processes(config, workdir: str, *flags: str) -> list[str]:
  """Trains `config` in two processes to the end; returns their outputs."""
  runs = start_two_processes(config, workdir, *flags)
  outputs = [run.communicate(timeout=600)[0] for run in runs]
  for run, output in zip(runs, outputs):
    assert run.returncode == 0, output[-3000:]
  return outputs


def final_params(workdir: str, config):
  setup = train.make_setup(config, 10, config.dataset.num_train_examples)
  state = train.create_train_state(setup, jax.random.key(99))  # a different init: restore must replace it
  return jax.tree.map(np.asarray, checkpoints.restore(checkpoints.manager(workdir, config), state)[0].params)


def lines(workdir: str) -> list[dict]:
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
  """The workdir of the tower strategy trained here, one process with conftest's two devices."""
  config = demo_config("tower")
  config.cpu_devices = 0
  workdir = str(tmp_path_factory.mktemp("one"))
  loop.train_and_evaluate(config, workdir)
  return workdir


# Who trains the first 3 of the 6 steps before two processes resume: two processes (for data under pmap, whose
# checkpoints are shard_map's), or one process with two devices (the input position does not depend on processes).
FIRST_HALF = {"tower": (2, ()), "data": (2, ("--config.parallel_api=pmap",)), "hybrid": (1, ())}


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_processes_stopped_and_resumed_train_as_one_process_with_two_devices(strategy, one_process, tmp_path):
  config, one, two = demo_config(strategy), one_process, str(tmp_path / "two")
  processes, flags = FIRST_HALF[strategy]
  if processes == 2:
    two_processes(config, two, "--config.num_epochs=0.5", *flags)
  else:
    half = demo_config(strategy)
    half.num_epochs, half.cpu_devices = 0.5, 0
    loop.train_and_evaluate(half, two)
  outputs = two_processes(config, two)
  assert all("steps 3→6" in output for output in outputs)  # every process resumed from the checkpoint
  # Both towers (or data shards, or fc slices) saw the global batch one process reads, from the restored position
  # on: the uninterrupted run's parameters.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), final_params(two, config),
               final_params(one, config))
  # Process 0 alone writes each line (the first half logs and evaluates its last step, 3), evaluation counts each of
  # the 15 examples once.
  assert [(r["step"], r["split"]) for r in lines(one)] == [(2, "train"), (4, "train"), (6, "train"), (6, "eval")]
  assert [(r["step"], r["split"]) for r in lines(two)] == [(2, "train"), (3, "train"), (3, "eval"), (4, "train"),
                                                           (6, "train"), (6, "eval")]
  assert [r["count"] for r in lines(two) if r["split"] == "eval"] == [15, 15]
  assert {"curves.png", "conv1_filters.png"} <= set(os.listdir(two))
  assert sorted(os.listdir(os.path.join(two, "checkpoints"))) == ["3", "6"]
  assert ["conv1 colour" in output for output in outputs] == [True, False]


def test_distributed_settings_come_from_the_config_or_the_environment(monkeypatch):
  config = demo_config("tower")
  assert distributed.settings(config) is None  # one process
  for name in distributed.ENVIRONMENT.values():
    monkeypatch.delenv(name, raising=False)
  config.distributed.update(dict(coordinator="10.0.0.1:1234", num_processes=4, process_id=3))
  assert distributed.settings(config) == dict(coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3)
  config.distributed.update(dict(coordinator="", num_processes=0, process_id=-1))
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "h:1")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  assert distributed.settings(config) == dict(coordinator_address="h:1", num_processes=2, process_id=1)
  monkeypatch.delenv("JAX_PROCESS_ID")
  with pytest.raises(ValueError, match="process_id in"):
    distributed.settings(config)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_one_process_stops_every_process_after_the_same_step_saved(signum, tmp_path):
  # What a node's preemption or a closed terminal does to one process of a run: the other, which received nothing,
  # must stop after the same step, or its save (which takes every process) would wait forever.
  config, workdir = demo_config("tower"), str(tmp_path)
  runs = start_two_processes(config, workdir, "--config.num_epochs=1000", "--config.checkpoint_every_steps=100000")
  metrics = os.path.join(workdir, "metrics.jsonl")
  deadline = time.time() + 300
  while not (os.path.exists(metrics) and os.path.getsize(metrics)) and time.time() < deadline:
    assert all(run.poll() is None for run in runs), [run.communicate()[0][-3000:] for run in runs]
    time.sleep(0.2)
  runs[1].send_signal(signum)  # process 1 alone; process 0 writes the metrics
  outputs = [run.communicate(timeout=300)[0] for run in runs]
  assert [run.returncode for run in runs] == [128 + signum] * 2, [output[-3000:] for output in outputs]
  stopped = [re.search(rf"stopped by {signal.Signals(signum).name} after step (\d+)", output) for output in outputs]
  assert all(stopped), outputs
  step = {m.group(1) for m in stopped}
  assert len(step) == 1 and os.listdir(os.path.join(workdir, "checkpoints")) == list(step)
