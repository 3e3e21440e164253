"""Every test sees two CPU devices: the paper's two GPUs, simulated."""

import atexit
import fcntl
import json
import os
import shutil
import tempfile

from alexnet_jax.config import cpu_threads

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on the CPU interpreter in tests
# XLA:CPU compiles the tests' steps about twice as fast with LLVM at -O1 and without its expensive passes, and runs
# them as fast: the same HLO, the same numbers. Its convolutions and GEMMs run ~20 % faster in the tests' networks
# without YNNPACK's fusions (conv1's filter gradient, stride 4, took a fifth of the demo's step in one). The scripts
# the tests start inherit it.
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=1",
                                    "--xla_llvm_disable_expensive_passes=true",
                                    "--xla_cpu_experimental_ynn_fusion_type="]).strip()

# The simulated devices' collectives wait in XLA:CPU's threads: as many as the scripts get (config.cpu_threads).
os.environ.setdefault("NPROC", str(cpu_threads(2)))

if os.environ.get("PYTEST_XDIST_WORKER"):
  # Workers share a GPU (`pytest -m gpu -n 4`): each allocates as it needs, instead of the first taking 75 % of it.
  os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

if "PYTEST_XDIST_WORKER" not in os.environ and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  # One persistent compilation cache for the run, inherited by its workers and the scripts the tests start: they
  # compile many of the same programs (the demo's step, the small networks' steps); the first compile of each is kept
  # and later ones read it. A fresh directory per run, so every run compiles each program at least once.
  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="alexnet_jax_tests_xla_")
  os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)


@pytest.fixture(scope="package")  # the tests/ folder is no package: one for the run
def once(tmp_path_factory):
  """once(name, make) → (workdir, make(workdir)) for an expensive run that several tests read: pytest-xdist sends
  neighbouring tests to different workers, so the first worker to ask makes it and the others wait for it and read
  it (make's result must be JSON)."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # this run's directory, shared by its workers

  def run(name, make):
    workdir, result = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
      fcntl.flock(lock, fcntl.LOCK_EX)
      if not result.exists():
        workdir.mkdir(exist_ok=True)
        result.write_text(json.dumps(make(str(workdir))))
      return str(workdir), json.loads(result.read_text())

  return run
