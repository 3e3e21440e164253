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


# Who trains the first steps of the 6 before two processes resume: two processes stopped by a SIGTERM that reaches one
# of them alone (what a node's preemption does), two processes to step 3 (for data under pmap, whose checkpoints are
# shard_map's), or one process with two devices to step 3 (the input position does not depend on processes).
FIRST_HALF = {"tower": "signal", "data": "pmap", "hybrid": "one process"}


def stopped_by_a_signal_to_one_process(config, workdir: str) -> int:
  """Starts two processes, sends process 1 alone a SIGTERM once it is about to train, and returns the step after
  which both stopped: the same on both (the other could not save without it), and saved."""
  runs = start_two_processes(config, workdir)
  seen = []
  for line in runs[1].stdout:  # train_and_evaluate prints this line once its signal handlers are in place
    seen.append(line)
    if " parameters, mesh " in line:
      runs[1].send_signal(signal.SIGTERM)
      break
  outputs = [run.communicate(timeout=300)[0] for run in runs]
  outputs[1] = "".join(seen) + outputs[1]
  assert [run.returncode for run in runs] == [128 + signal.SIGTERM] * 2, [output[-3000:] for output in outputs]
  steps = {int(step) for output in outputs for step in re.findall(r"stopped by SIGTERM after step (\d+)", output)}
  assert len(steps) == 1, outputs
  (step,) = steps
  assert str(step) in os.listdir(os.path.join(workdir, "checkpoints"))
  return step


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_two_processes_stopped_and_resumed_train_as_one_process_with_two_devices(strategy, one_process, tmp_path):
  config, one, two = demo_config(strategy), one_process, str(tmp_path / "two")
  first_half = FIRST_HALF[strategy]
  if first_half == "signal":
    stopped = stopped_by_a_signal_to_one_process(config, two)
  elif first_half == "pmap":
    two_processes(config, two, "--config.num_epochs=0.5", "--config.parallel_api=pmap")
  else:
    half = demo_config(strategy)
    half.num_epochs, half.cpu_devices = 0.5, 0
    loop.train_and_evaluate(half, two)
  if first_half != "signal":
    stopped = 3
  outputs = two_processes(config, two)
  assert all(f"steps {stopped}→6" in output for output in outputs)  # every process resumed from the checkpoint
  # Both towers (or data shards, or fc slices) saw the global batch one process reads, from the restored position
  # on: the uninterrupted run's parameters.
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), final_params(two, config),
               final_params(one, config))
  # Process 0 alone writes each line (a first half to step 3 logs and evaluates its last step; a signal stops before
  # the next log), evaluation counts each of the 15 examples once.
  assert [(r["step"], r["split"]) for r in lines(one)] == [(2, "train"), (4, "train"), (6, "train"), (6, "eval")]
  if first_half == "signal":
    assert [(r["step"], r["split"]) for r in lines(two)] == [(2, "train"), (4, "train"), (6, "train"), (6, "eval")]
  else:
    assert [(r["step"], r["split"]) for r in lines(two)] == [(2, "train"), (3, "train"), (3, "eval"), (4, "train"),
                                                             (6, "train"), (6, "eval")]
  assert [r["count"] for r in lines(two) if r["split"] == "eval"] == [15] * (1 + (first_half != "signal"))
  assert {"curves.png", "conv1_filters.png"} <= set(os.listdir(two))
  assert sorted(map(int, os.listdir(os.path.join(two, "checkpoints")))) == sorted({stopped, 3, 6})
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
