"""The scripts' one command line: absl flags, a `--config` file read by ml_collections' config_flags with
`--config.key=value` overrides, and whatever the parser refuses reported in one line instead of a traceback."""

import os
import re
import sys
import threading
import time
import traceback

import ml_collections
from absl import app, flags, logging
from ml_collections import config_flags


def define_config(help_text: str) -> None:
  """--config FILE: a configs/*.py file whose get_config() is locked, so an override of a key it lacks is refused;
  --show_config lists its keys."""
  config_flags.DEFINE_config_file("config", None, f"{help_text}; --config.KEY=VALUE sets a key (--show_config lists "
                                  "them)", lock_config=True)
  _own_flags(("config",))


def define_run_config() -> None:
  """--workdir DIR, a training run's directory, and --config: the run's own config (DIR/run.json), whose keys
  --config.KEY=VALUE may override (training/run.py says which it may not); --show_config lists them."""
  from alexnet_jax.config import paper_config  # noqa: PLC0415
  from alexnet_jax.training import run  # noqa: PLC0415

  flags.DEFINE_string("workdir", None, "a training run's directory (its run.json and checkpoints/ are read)")
  workdir = _argv_value(sys.argv, "--workdir")
  global _run_error
  try:
    config = run.read(workdir).config if workdir else paper_config()
  except ValueError as e:
    config, _run_error = paper_config(), str(e)  # reported in one line once the flags are parsed (--help works)
  try:  # ml_collections reads the --config.KEY overrides here, from sys.argv
    config_flags.DEFINE_config_dict("config", config, "the run's config; --config.KEY=VALUE overrides a key "
                                    "(--show_config lists them)", lock_config=True)
  except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as e:
    sys.exit(_bad_flag(e))
  _own_flags(("config", "workdir"))
  global _reads_a_run
  _reads_a_run = True


_reads_a_run = False  # define_run_config was called: --config is the run's, not a file
_run_error = None  # why --workdir's run.json cannot be read, refused before the script imports its heavy modules


def _own_flags(names) -> None:
  """--show_config, and `names` listed by --help among the flags of the script that calls define_*: absl lists a
  script's own flags, and ml_collections defines --config (as absl's declare_key_flag would make them, were it
  called there)."""
  flags.DEFINE_bool("show_config", False, "print every config key with its value, what it may be and one line of "
                    "doc, then exit")
  caller = sys._getframe(2).f_globals["__name__"]
  module = sys.argv[0] if caller == "__main__" else caller
  for name in (*names, "show_config"):
    flags.FLAGS.register_key_flag_for_module(module, flags.FLAGS[name])


def _argv_value(argv, name: str) -> str | None:
  """The value of flag `name` in argv (`--name=V` or `--name V`), if given."""
  for i, arg in enumerate(argv):
    if arg.startswith(name + "="):
      return arg.split("=", 1)[1]
    if arg == name and i + 1 < len(argv):
      return argv[i + 1]
  return None


def config_name() -> str:
  """The --config file's name without folder or .py, e.g. 'demo' (runs/<name> is a run's default workdir)."""
  return os.path.basename(config_flags.get_config_filename(flags.FLAGS["config"])).removesuffix(".py")


def _config_file(argv) -> str | None:
  """The --config argument's file (without ml_collections' ':arguments' suffix), if given."""
  value = _argv_value(argv, "--config")
  return value.split(":", 1)[0] if value is not None else None


def _raised_in(e: BaseException, path: str) -> tuple[BaseException, int] | None:
  """(exception, line) of the exception in `e`'s chain that the file `path` raised, if any (ml_collections
  re-raises a config file's TypeError and ValueError as new ones)."""
  path = os.path.abspath(path)
  while e is not None:
    if isinstance(e, SyntaxError) and e.filename and os.path.abspath(e.filename) == path:
      return e, e.lineno
    lines = [n for frame, n in traceback.walk_tb(e.__traceback__) if os.path.abspath(frame.f_code.co_filename) == path]
    if lines:
      return e, lines[-1]
    e = e.__cause__ or e.__context__
  return None


def _config_file_fault(e: BaseException, path: str) -> str | None:
  """What is wrong with a config file that fails before its code runs or is called amiss, if that is the fault:
  ml_collections reports these as errors of its own, or the required --config as unset."""
  for error in _chain(e):
    if isinstance(error, SyntaxError):  # null bytes: Python refuses the file before it has lines
      return f"SyntaxError: {error.msg}"
    if isinstance(error, AttributeError) and "get_config" in str(error):
      return "it defines no get_config()"
    if isinstance(error, TypeError) and (m := re.search(r"get_config\(\) (missing|takes)[^\n]*", str(error))):
      return f"{m.group(0)}: the scripts call get_config() without arguments"
  if "--config must have a value other than None" in str(e):
    return "get_config() returned None, not an ml_collections.ConfigDict: is its return statement missing?"
  return None


def _chain(e: BaseException):
  while e is not None:
    yield e
    e = e.__cause__ or e.__context__


def _kind(value) -> str:
  return f"a {type(value).__name__}" if value is not None else "None"


HELP_FLAGS = ("-?", "--help", "-help", "--helpshort", "-helpshort", "--helpfull", "-helpfull", "--helpxml",
              "-helpxml")


def parse_flags(argv):
  """absl's parser, with a missing or broken --config file, a mistyped flag or --config.key reported in one
  line."""
  path = _config_file(argv)
  if path is not None and _reads_a_run:
    sys.exit("error: this script reads a run's own config (WORKDIR/run.json), not --config FILE; set a key with "
             "--config.KEY=VALUE")
  if path is not None and not os.path.isfile(path):
    sys.exit(f"error: no config file {path}")
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)  # ml_collections warns of a get_config() returning None: said below
  try:
    argv = flags.FLAGS(argv)
  except SystemExit as e:
    if raised := path and _raised_in(e, path):  # the config file exits: that is an error in it, not a result
      sys.exit(f"error: config file {path}, line {raised[1]}: it calls sys.exit({e.code!r}) instead of returning a "
               "config")
    if e.code == 1 and any(a.split("=")[0] in HELP_FLAGS for a in argv[1:]):
      sys.exit(0)  # absl's --help and --helpfull print what was asked for, then exit 1: not a failure
    raise
  except Exception as e:
    if raised := path and _raised_in(e, path):  # the config file's own code failed
      error, line = raised
      message = error.msg if isinstance(error, SyntaxError) else _short(str(error))
      sys.exit(f"error: config file {path}, line {line}: {type(error).__name__}: {message}")
    if path and (said := _config_file_fault(e, path)):
      sys.exit(f"error: config file {path}: {said}")
    if not isinstance(e, AttributeError | KeyError | TypeError | ValueError | flags.Error):
      raise
    sys.exit(_bad_flag(e))
  finally:
    logging.set_verbosity(verbosity)
  if path and not isinstance(flags.FLAGS["config"].value, ml_collections.ConfigDict):
    sys.exit(f"error: config file {path}: get_config() returned {_kind(flags.FLAGS['config'].value)}, not an "
             "ml_collections.ConfigDict: return alexnet_jax.config.paper_config() with your changes")
  for name in PATH_FLAGS:  # `--workdir=` would quietly mean the default, and resume whatever run is there
    if name in flags.FLAGS and flags.FLAGS[name].present and not (flags.FLAGS[name].value or "").strip():
      sys.exit(f"error: --{name} is empty: give it a path, or leave the flag out")
  return argv


PATH_FLAGS = ("workdir", "out", "json", "csv", "artifact", "store", "data_dir", "manual_dir")


def _short(message: str) -> str:
  """An error message on one line: ml_collections nests a repr in its errors, and lists every key of the config
  after a locked config's unknown one ('Other fields present: …'), where its 'Did you mean' says enough."""
  message = message.replace("\\'", "'").replace("\\n", " ")
  if len(message) > 1 and message[0] == message[-1] == "'":
    message = message[1:-1]
  message = re.sub(r'\s*Other fields present: "\{.*\}"', "", message, flags=re.S)
  return " ".join(message.split())


def _bad_flag(e: Exception) -> str:
  return f"error: bad flag: {_short(str(e))}"


def run(main, required=()) -> None:
  """app.run(main) through parse_flags, after marking `required` flags as such (a missing one is one line too); a
  Ctrl-C that training does not catch itself (training/guard.py) ends in one line too. --show_config prints the
  config's keys instead of running main."""
  if required:
    flags.mark_flags_as_required(list(required))

  def main_or_show(argv):
    if _run_error:
      sys.exit(f"error: {_run_error}")
    if "show_config" in flags.FLAGS and flags.FLAGS.show_config:
      from alexnet_jax.config import describe  # noqa: PLC0415

      print(describe(flags.FLAGS.config))
      return None
    return main(argv)

  logging.set_verbosity(logging.WARNING)  # orbax and JAX log at INFO what a script's own lines say better
  for stream in (sys.stdout, sys.stderr):  # a terminal or pipe in ASCII gets \u2248 for ≈, not an error
    if hasattr(stream, "reconfigure"):
      stream.reconfigure(errors="backslashreplace")
  try:
    app.run(main_or_show, flags_parser=parse_flags)
  except KeyboardInterrupt:
    print("\ninterrupted", file=sys.stderr)
    _leave(130)  # 128 + SIGINT, the shell's convention
  except SystemExit as e:
    if e.code not in (None, 0):
      if not isinstance(e.code, int):
        print(e.code, file=sys.stderr)
      _leave(e.code if isinstance(e.code, int) else 1)
    raise


EXIT_GRACE_S = 10.0  # for the threads still running when a script fails, before it ends without them


def _leave(status: int) -> None:
  """Ends a failed script with `status` within EXIT_GRACE_S: a library's thread left waiting for a signal that a
  failed operation never sent (orbax's, after a save that broke) would otherwise hold the process at its end."""
  for stream in (sys.stdout, sys.stderr):
    stream.flush()
  deadline = time.monotonic() + EXIT_GRACE_S
  for thread in threading.enumerate():
    if thread is not threading.current_thread() and not thread.daemon:
      threading.Thread.join(thread, max(0.0, deadline - time.monotonic()))  # orbax's own join raises on a timeout
  if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread()):
    os._exit(status)
  sys.exit(status)
