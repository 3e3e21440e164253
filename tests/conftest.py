"""Every test sees two CPU devices: the paper's two GPUs, simulated."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # Triton kernels run on the CPU interpreter in tests

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 2)
