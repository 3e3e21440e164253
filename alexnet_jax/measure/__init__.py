"""Measurement tools: the benchmark's systems (systems.py) and its plain-XLA yardstick (baseline.py), what a step moves
between devices (comm.py) read from compiled HLO (hlo.py, layouts.py), per-kernel times from profiles
(kernel_times.py), the kernels' checks against float64 (kernel_checks.py) on the shapes they run on
(kernel_shapes.py), what the kernels compile to for a GPU, read without one (kernel_code.py), and the step-time model
that predicts a placement's step on more devices (step_model.py)."""
