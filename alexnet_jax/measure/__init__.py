"""Measurement tools: the benchmark's systems (systems.py) and its plain-XLA yardstick (baseline.py), what a step
moves between devices (comm.py) read from compiled HLO (hlo.py, layouts.py), per-kernel times from profiles
(kernel_times.py), and the kernels' checks against float64 (kernel_checks.py) on the shapes they run on
(kernel_shapes.py)."""
