"""The worker processes that training (data/pipeline.py) and make prepare (data/prepare.py) start end with the
process that started them, however it ends."""

import os
import threading
import time


def exit_with(parent: int, poll_s: float = 0.2) -> None:
  """Ends this process within poll_s of process `parent` ending, however it ends (SIGKILL included). Otherwise a
  worker lives on, waiting on its queue and holding its memory, and, its signals blocked, ignores a SIGTERM. A thread
  watches this process's parent, which becomes another once `parent` is gone; Linux's PR_SET_PDEATHSIG would not
  do: it fires when the *thread* that started the process ends, and Grain starts its workers from threads of a pool
  that can end while the run goes on."""

  def watch():
    while os.getppid() == parent:
      time.sleep(poll_s)
    os._exit(1)

  threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()
