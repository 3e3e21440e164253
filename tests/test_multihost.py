"""Runs of two processes on 127.0.0.1 (CPU devices, gloo collectives), one device each, through the documented
launch line, stopped by a signal to one process: the paper's tower split, resumed by one process, and pmap's data
parallelism, resumed by two as the hybrid. Each ends at the parameters of an uninterrupted process with two devices
(every strategy computes the same function: the tower run stands for all), metrics written once, every evaluation
example counted once, and pictures of filters held on the other process. The network is the paper's kinds of layer
at their smallest (a conv reading across towers, LRN, dropout, fc layers gathered and summed), so that each process
compiles in seconds; tests/test_placement.py checks each strategy's placement of the paper's network."""

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
CONFIG = """
from alexnet_jax.config import paper_config
from alexnet_jax.network import table
from alexnet_jax.network.table import Layer, Table


@table.register("multihost_test_net")
def net(*, num_classes, width, towers, lrn_alpha_over_n):
  return Table((Layer("conv1", "conv", filters=8, size=5, stride=2),
                Layer("lrn1", "lrn", size=5, k=2.0, alpha=1e-4, beta=0.75, alpha_over_n=lrn_alpha_over_n),
                Layer("pool1", "pool", size=3, stride=2),
                Layer("conv2", "conv", filters=8, size=3, padding=1, inputs="all"),
                Layer("pool2", "pool", size=3, stride=2),
                Layer("fc3", "fc", filters=32, inputs="all"),
                Layer("drop3", "dropout", rate=0.5),
                Layer("fc4", "fc", filters=num_classes, split="sum", relu=False)), towers)


def get_config():
  c = paper_config()
  c.cpu_devices, c.network, c.image_size, c.weight_init = 2, "multihost_test_net", 32, "he"
  c.dataset.name, c.dataset.num_classes = "procedural", 10
  c.dataset.num_train_examples, c.dataset.num_eval_examples = 48, 15  # 6 steps; evaluation's second batch is padded
  c.batch_size, c.eval_batch_size, c.learning_rate, c.num_epochs = 8, 10, 0.01, 1.0
  c.log_every_steps, c.eval_every_steps, c.checkpoint_every_steps = 2, 6, 3
  return c
"""
_namespace = {}
exec(compile(CONFIG, "multihost_config", "exec"), _namespace)  # registers the network in this process
STRATEGIES = {"tower": dict(strategy="tower", mesh=dict(model=2, data=1)),
              "data": dict(strategy="data", mesh=dict(model=1, data=2)),
              "hybrid": dict(strategy="hybrid", mesh=dict(model=2, data=1))}


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("config") / "multihost.py"
  path.write_text(CONFIG)
  return str(path)


def tiny_config(strategy: str, **changes):
  """The config file's config with a strategy, run in this process on conftest's two devices."""
  config = _namespace["get_config"]()
  config.update(STRATEGIES[strategy] | dict(cpu_devices=0) | changes)
  return config


def start_two_processes(config_file: str, strategy: str, workdir: str, *flags: str) -> list[subprocess.Popen]:
  """Starts training the config file with a strategy (and further command-line flags) in two processes, one CPU
  device each."""
  address = f"127.0.0.1:{portpicker.pick_unused_port()}"
  env = dict(os.environ, PYTHONPATH=ROOT, TRITON_INTERPRET="1")
  mesh = STRATEGIES[strategy]["mesh"]
  placed = [f"--config.strategy={strategy}", *(f"--config.mesh.{k}={v}" for k, v in mesh.items())]
  return [subprocess.Popen([sys.executable, "scripts/train.py", "--config", config_file, f"--workdir={workdir}",
                            *placed, *flags, f"--config.distributed.coordinator={address}",
                            "--config.distributed.num_processes=2", f"--config.distributed.process_id={i}"],
                           cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for i in range(2)]


def two_processes(config_file: str, strategy: str, workdir: str, *flags: str) -> list[str]:
  """Trains in two processes to the end; returns their outputs."""
  runs = start_two_processes(config_file, strategy, workdir, *flags)
  outputs = [run.communicate(timeout=600)[0] for run in runs]
  for run, output in zip(runs, outputs):
    assert run.returncode == 0, output[-3000:]
  return outputs


def final_params(workdir: str, config):
  setup = train.make_setup(config, 10, config.dataset.num_train_examples)
  state = train.create_train_state(setup, jax.random.key(99))  # a different init: restore must replace it
  return jax.tree.map(np.asarray, checkpoints.restore(checkpoints.manager(workdir, config), state)[0].params)


def assert_same_params(workdir: str, config, reference: str):
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), final_params(workdir, config),
               final_params(reference, tiny_config("tower")))


def lines(workdir: str) -> list[dict]:
  return [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]


@pytest.fixture
def one_process(once):
  """The workdir of the tower strategy trained in one process with conftest's two devices."""
  trained = lambda workdir: jax.tree.map(float, loop.train_and_evaluate(tiny_config("tower"), workdir))  # noqa: E731
  return once("multihost_one_process", trained)[0]


def stopped_by_a_signal_to_one_process(config_file: str, strategy: str, workdir: str, *flags: str) -> int:
  """Starts two processes, sends process 1 alone a SIGTERM once it is about to train (what a node's preemption
  does), and returns the step after which both stopped: the same on both (the other could not save without it),
  and saved."""
  runs = start_two_processes(config_file, strategy, workdir, *flags)
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


def test_the_paper_s_tower_split_in_two_processes_stopped_by_a_signal_to_one_resumes_in_one_process(
    config_file, one_process, tmp_path):
  # The paper's own case: a tower on each process, conv2 reading both (the cross-tower gather between the
  # processes), fc3 and fc4 gathered and summed. Process 1 alone is signalled; both save the same step. One process
  # of two devices resumes it (fewer processes than wrote it: the input position does not count them) to the
  # parameters of the uninterrupted run of one process.
  two = str(tmp_path / "two")
  stopped = stopped_by_a_signal_to_one_process(config_file, "tower", two)
  assert 0 < stopped < 6
  loop.train_and_evaluate(tiny_config("tower"), two)
  assert_same_params(two, tiny_config("tower"), one_process)
  assert [r["count"] for r in lines(two) if r["split"] == "eval"] == [15]


def test_two_processes_under_pmap_stopped_by_a_signal_to_one_resume_in_two_processes_as_the_hybrid(config_file,
                                                                                                   one_process,
                                                                                                   tmp_path):
  # pmap's data parallelism in two processes, process 1 alone signalled: both save the same step. The checkpoint is
  # shard_map's and the input position depends on neither the processes nor the strategy: the hybrid, which moves
  # the most between the processes (the batch split over both for the convolutions, gathered whole at fc3, fc3 and
  # fc4 cut into slices and fc4's partial logits summed), resumes it in two processes to the parameters of the
  # uninterrupted run of one process.
  two = str(tmp_path / "two")
  stopped = stopped_by_a_signal_to_one_process(config_file, "data", two, "--config.parallel_api=pmap")
  outputs = two_processes(config_file, "hybrid", two)
  assert all(f"steps {stopped}→6" in output for output in outputs)  # every process resumed from the checkpoint
  assert_same_params(two, tiny_config("hybrid"), one_process)
  # Process 0 alone writes each line (a signal stops before the next log), evaluation counts each of the 15 examples
  # once.
  assert [(r["step"], r["split"]) for r in lines(one_process)] == [(2, "train"), (4, "train"), (6, "train"),
                                                                   (6, "eval")]
  assert [(r["step"], r["split"]) for r in lines(two)] == [(2, "train"), (4, "train"), (6, "train"), (6, "eval")]
  assert [r["count"] for r in lines(two) if r["split"] == "eval"] == [15]
  assert {"curves.png", "conv1_filters.png"} <= set(os.listdir(two))
  assert sorted(map(int, os.listdir(os.path.join(two, "checkpoints")))) == sorted({stopped, 3, 6})
  assert ["conv1 colour" in output for output in outputs] == [True, False]


def test_distributed_settings_come_from_the_config_or_the_environment(monkeypatch):
  config = tiny_config("tower")
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
