"""Several processes, on one host or many: jax.distributed set up from the config or the environment.

A run of N processes starts the same command N times, each with its own process id, all naming process 0's address
(docs/multihost.md). Each process then drives its own devices; every process computes every step, process 0 alone
writes metrics, TensorBoard files and pictures, and orbax writes checkpoints from all of them together.
"""

import os

import jax

# Read where the config leaves a setting unset (JAX itself reads only the first).
ENVIRONMENT = dict(coordinator="JAX_COORDINATOR_ADDRESS", num_processes="JAX_NUM_PROCESSES",
                   process_id="JAX_PROCESS_ID")


def settings(config) -> dict | None:
  """jax.distributed.initialize's arguments from config.distributed, each unset one from the environment; {} to let
  JAX detect them (Slurm, Open MPI, Cloud TPU: config.distributed.detect); None for a run of one process."""
  d = config.distributed
  if d.detect:
    return {}
  env = {key: os.environ.get(name, "") for key, name in ENVIRONMENT.items()}
  coordinator = d.coordinator or env["coordinator"]
  processes = d.num_processes or int(env["num_processes"] or 0)
  process = d.process_id if d.process_id >= 0 else int(env["process_id"] or -1)
  if not coordinator and processes <= 1:
    return None
  if not coordinator or processes < 2 or not 0 <= process < processes:
    raise ValueError(f"a run of several processes needs config.distributed.coordinator (host:port of process 0), "
                     f"num_processes ≥ 2 and process_id in [0, num_processes), or the environment's "
                     f"{', '.join(ENVIRONMENT.values())}; got {coordinator or 'no coordinator'!r}, {processes}, "
                     f"{process}")
  return dict(coordinator_address=coordinator, num_processes=processes, process_id=process)


def initialize(config) -> None:
  """Joins the run's processes, before the first JAX computation. On CPU, config.cpu_devices counts the devices of
  the whole run: each process simulates its share."""
  args = settings(config)
  if args is None:
    return
  processes = args.get("num_processes")
  if config.cpu_devices and processes:
    if config.cpu_devices % processes:
      raise ValueError(f"config.cpu_devices={config.cpu_devices} does not split over {processes} processes")
    jax.config.update("jax_num_cpu_devices", config.cpu_devices // processes)
  # Its SIGTERM handler would take the signal from ours, which make every process stop after the same step
  # (guard.Signals).
  jax.config.update("jax_enable_preemption_service", False)
  jax.distributed.initialize(**args)


def is_writer() -> bool:
  """Whether this process writes the run's files (metrics, TensorBoard, pictures): process 0."""
  return jax.process_index() == 0
