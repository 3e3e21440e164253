"""The worker processes that training (data/pipeline.py) and make prepare (data/prepare.py) start end with the
process that started them, however it ends; training's leave the signals that stop a run to it."""

import contextlib
import os
import signal
import sys
import threading
import time
from multiprocessing import resource_tracker

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # a preemption, Ctrl-C, a closed terminal
TRACKER_QUIET = "ignore:resource_tracker:UserWarning:multiprocessing.resource_tracker"


def exit_with(parent: int, poll_s: float = 0.2, before_exit=lambda: None) -> None:
  """Ends this process within poll_s of process `parent` ending, however it ends (SIGKILL included). Otherwise a
  worker lives on, waiting on its queue and holding its memory, and, its signals blocked, ignores a SIGTERM. A thread
  watches this process's parent, which becomes another once `parent` is gone; Linux's PR_SET_PDEATHSIG would not
  do: it fires when the *thread* that started the process ends, and Grain starts its workers from threads of a pool
  that can end while the run goes on."""

  def watch():
    while os.getppid() == parent:
      time.sleep(poll_s)
    before_exit()  # what the worker leaves behind that only it knows of
    os._exit(1)

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@contextlib.contextmanager
def left_to_this_thread():
  """Within: SIGNALS blocked in the calling thread, and so in the threads it starts and, through them, in the
  processes those start (a thread's signal mask is inherited, and kept across exec): the feed thread and Grain's
  data workers, which a signal to the whole process group (Slurm's scancel, a container's stop, Ctrl-C) would
  otherwise reach too, killing a worker before the step is saved. Training handles them alone (training/guard.py),
  then stops the workers itself."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  # multiprocessing's resource tracker, started on first need, unblocks SIGINT and SIGTERM in the thread that starts
  # it (CPython's resource_tracker.ensure_running), which would undo this for the processes started after it: it is
  # started first. It removes the shared-memory blocks that workers stopped mid-batch leave (data/pipeline.py) when
  # the run ends, with a warning that is no news to the user: it takes this process's -W options as it starts.
  if TRACKER_QUIET not in sys.warnoptions:
    sys.warnoptions.append(TRACKER_QUIET)
  resource_tracker.ensure_running()
  held = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
  try:
    yield
  finally:
    signal.pthread_sigmask(signal.SIG_SETMASK, held)  # one that came meanwhile is delivered now, to training's handler
