"""Every test sees two CPU devices: the paper's two GPUs, simulated."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on the CPU interpreter in tests
# XLA:CPU compiles the tests' steps about twice as fast with LLVM at -O1 and without its expensive passes, and runs
# them as fast: the same HLO, the same numbers. The scripts the tests start inherit it.
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=1",
                                    "--xla_llvm_disable_expensive_passes=true"]).strip()

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)
