"""Training: the steps (train.py), the loop (loop.py) and pmap's data parallelism (pmap.py), with what a run needs
around them: checkpoints, the guard against divergence and signals, metrics, pictures, the workdir's lock, the
processes of a multi-process run (distributed.py), and what reads a run back (restore.py, evaluation.py)."""
