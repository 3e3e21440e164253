"""The scripts' one command line: absl flags, a `--config` file read by ml_collections' config_flags with
`--config.key=value` overrides, and whatever the parser refuses reported in one line instead of a traceback."""

import os
import sys
import traceback

from absl import app, flags
from ml_collections import config_flags


def define_config(help_text: str) -> None:
  """--config FILE: a configs/*.py file whose get_config() is locked, so an override of a key it lacks is refused."""
  config_flags.DEFINE_config_file("config", None, help_text, lock_config=True)


def config_name() -> str:
  """The --config file's name without folder or .py, e.g. 'demo' (runs/<name> is a run's default workdir)."""
  return os.path.basename(config_flags.get_config_filename(flags.FLAGS["config"])).removesuffix(".py")


def _config_file(argv) -> str | None:
  """The --config argument's file (without ml_collections' ':arguments' suffix), if given."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1].split(":", 1)[0]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1].split(":", 1)[0]
  return None


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


def parse_flags(argv):
  """absl's parser, with a missing or broken --config file, a mistyped flag or --config.key reported in one
  line."""
  path = _config_file(argv)
  if path is not None and not os.path.isfile(path):
    sys.exit(f"error: no config file {path}")
  try:
    return flags.FLAGS(argv)
  except Exception as e:
    if raised := path and _raised_in(e, path):  # the config file's own code failed
      error, line = raised
      message = error.msg if isinstance(error, SyntaxError) else str(error)
      sys.exit(f"error: config file {path}, line {line}: {type(error).__name__}: {' '.join(message.split())}")
    if isinstance(e, AttributeError) and "get_config" in str(e):
      sys.exit(f"error: config file {path} defines no get_config()")
    if not isinstance(e, AttributeError | KeyError | TypeError | ValueError | flags.Error):
      raise
    message = str(e).replace("\\'", "'").replace("\\n", " ")  # ml_collections nests a repr in its errors
    if len(message) > 1 and message[0] == message[-1] == "'":
      message = message[1:-1]
    sys.exit(f"error: bad flag: {' '.join(message.split())}")


def run(main, required=()) -> None:
  """app.run(main) through parse_flags, after marking `required` flags as such (a missing one is one line too); a
  Ctrl-C that training does not catch itself (guard.py) ends in one line too."""
  if required:
    flags.mark_flags_as_required(list(required))
  try:
    app.run(main, flags_parser=parse_flags)
  except KeyboardInterrupt:
    print("\ninterrupted", file=sys.stderr)
    sys.exit(130)  # 128 + SIGINT, the shell's convention
