"""A training run's hold on its workdir: an advisory lock that refuses a second run in the same directory, and
failures to write there (read-only, not a directory, disk full) reported in one line naming the path. A run that
made its workdir and stops before writing anything in it (a mistyped data_dir, a split that is not there) takes the
directory away again, so that the next attempt, and `ls runs/`, do not meet an empty run."""

import contextlib
import errno
import fcntl
import os
import tempfile

LOCK = ".lock"  # in the workdir; holds the pid of the run that has it
FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # the disk (or a quota, or a file size limit) is full


class WorkdirError(ValueError):
  """The workdir cannot be used: another run holds it, or it cannot be written."""


def unwritable(workdir: str, e: OSError) -> WorkdirError:
  """The one line for an OSError met while writing in the workdir."""
  remedy = ("free space, then rerun the same command to resume from the last checkpoint" if e.errno in FULL else
            "pass a writable directory as --workdir")
  return WorkdirError(f"cannot write in {workdir}: {e.strerror or e} ({e.filename or workdir}): {remedy}")


def _inside(workdir: str, path) -> bool:
  if not isinstance(path, str | bytes | os.PathLike):
    return False
  root, path = os.path.abspath(workdir), os.path.abspath(os.fsdecode(path))
  return path == root or path.startswith(root + os.sep)


@contextlib.contextmanager
def claim(workdir: str, lock: bool = True):
  """Within: `workdir` exists and is this run's alone (an flock on <workdir>/.lock, released on exit, also when the
  process dies; lock=False leaves it to another process of the same run, such as the first of several hosts). An
  OSError about a path in the workdir, or one that says the disk is full, becomes a WorkdirError of one line. On the
  way out, the directories this call made go again if nothing but the lock was written in them."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise WorkdirError(f"--workdir {workdir} is a file, not a directory: pass a directory")
  checkpoints = os.path.join(workdir, "checkpoints")
  if os.path.lexists(checkpoints) and not os.path.isdir(checkpoints):  # orbax would fail at the first save
    raise WorkdirError(f"{checkpoints} is not a directory, and the run saves its checkpoints there: move it away, "
                       "or train in another --workdir")
  _check_length(workdir)
  made, held = _missing(workdir), None
  try:
    os.makedirs(workdir, exist_ok=True)
    held = open(os.path.join(workdir, LOCK), "a+") if lock else None
    for d in (workdir, os.path.join(workdir, "checkpoints")):  # before anything is trained that could not be saved
      if os.path.isdir(d):
        tempfile.TemporaryFile(dir=d).close()
  except OSError as e:
    raise unwritable(workdir, e) from None
  taken = False
  try:
    if held is not None:
      _take(held, workdir)
      taken = True
    yield
  except OSError as e:
    if e.errno in FULL or _inside(workdir, e.filename):
      raise unwritable(workdir, e) from None
    raise
  finally:
    if taken:  # only the run that holds the lock: a refused one would take the directory from under the holder
      _remove_if_empty(made)
    if held is not None:
      held.close()  # releases the flock


def _missing(workdir: str) -> list[str]:
  """The directories that makedirs(workdir) would make, workdir first."""
  missing, path = [], os.path.abspath(workdir)
  while not os.path.exists(path):
    missing.append(path)
    path = os.path.dirname(path)
  return missing


def _remove_if_empty(made: list[str]) -> None:
  """Removes the directories of `made` (this run's, workdir first) if nothing but the lock and empty folders lies in
  them; a file of any other name, a checkpoint's or run.json, keeps them all. A directory this run did not make is
  never touched."""
  if not made:
    return
  lock = os.path.join(made[0], LOCK)
  for root, dirs, files in os.walk(made[0]):
    if any(os.path.join(root, f) != lock for f in files) or any(os.path.islink(os.path.join(root, d)) for d in dirs):
      return
  try:
    for root, dirs, _ in os.walk(made[0], topdown=False):
      for d in dirs:
        os.rmdir(os.path.join(root, d))
    if os.path.exists(lock):
      os.remove(lock)
    for d in made:
      os.rmdir(d)
  except OSError:
    pass  # another process wrote there meanwhile, or removal is refused: the directory stays, as it would have


# What the checkpoints add below the workdir at most (checkpoints/<step>/state/ocdbt.process_<i>/d/<32 hex digits>,
# orbax's temporary names, TensorBoard's event files): a workdir this much under the system's limit can hold them.
PATH_ROOM = 160


def _check_length(workdir: str) -> None:
  """A workdir whose checkpoints' paths would pass the system's limit is refused before training, not at the
  first save."""
  path = os.path.abspath(workdir)
  parent = path
  while not os.path.isdir(parent):
    parent = os.path.dirname(parent)
  try:
    limit = os.pathconf(parent, "PC_PATH_MAX")
  except (OSError, ValueError):
    limit = 4096
  if len(os.fsencode(path)) + PATH_ROOM > limit:
    raise WorkdirError(f"--workdir is {len(os.fsencode(path)):,} bytes long: the checkpoints below it need "
                       f"{PATH_ROOM} more, over this system's {limit:,}-byte limit on a path; pass a shorter one")


def _take(lock, workdir: str) -> None:
  try:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    lock.seek(0)
    holder = lock.read().strip() or "unknown"
    raise WorkdirError(f"another run (pid {holder}) is using --workdir {workdir}: wait for it to finish, or train "
                       "in another directory") from None
  lock.seek(0)
  lock.truncate()
  lock.write(f"{os.getpid()}\n")
  lock.flush()


def write_file(path: str, data: bytes) -> None:
  """`data` into the file `path` whole or not at all (a temporary file beside it, renamed over it; a symbolic link
  is written through), or straight into what is there where that is not a file (a device, a pipe: renaming over
  it would replace it); one ValueError naming the path and why, the file as it was."""
  real = os.path.realpath(path)
  regular = not os.path.exists(real) or os.path.isfile(real)
  target = real + ".tmp" if regular else real
  try:
    with open(target, "wb") as f:
      f.write(data)
    if regular:
      os.replace(target, real)
  except OSError as e:
    if regular:
      with contextlib.suppress(OSError):
        os.remove(target)
    raise ValueError(f"cannot write {path}: {e.strerror or e}") from None


# What a training run writes in its workdir, as the first part of a path there (with its suffixes: metrics.jsonl.1,
# run.json.tmp): no script's output may be one, as writing it would destroy the run.
RUN_FILES = ("run.json", ".lock", "metrics.jsonl", "curves.png", "conv1_filters.png", "conv1_learned.png",
             "checkpoints", "tensorboard")


def check_output(flag: str, path: str, workdir: str | None) -> None:
  """Refuses the output `path` of a script's `flag` where it is the run's workdir itself or one of the run's own
  files; a new file in the workdir (an artifact, predictions) is fine."""
  if workdir and run_file(workdir, path):
    raise ValueError(f"{flag} {path} is a file of the run in {workdir}: write it elsewhere")


def run_file(workdir: str, path: str) -> bool:
  """Whether `path` is `workdir` or one of its run's files, as written and with links resolved (a checkpoints/
  that links to another disk is still the run's)."""
  for root, where in ((os.path.abspath(workdir), os.path.abspath(path)),
                      (os.path.realpath(workdir), os.path.realpath(path))):
    first = os.path.relpath(where, root).split(os.sep)[0]
    if first == "." or any(first == name or first.startswith(name + ".") for name in RUN_FILES):
      return True
  return False
