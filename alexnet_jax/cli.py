"""The scripts' one command line: absl flags, a `--config` file read by ml_collections' config_flags with
`--config.key=value` overrides, and whatever the parser refuses reported in one line instead of a traceback."""

import os
import sys

from absl import app, flags
from ml_collections import config_flags


def define_config(help_text: str) -> None:
  """--config FILE: a configs/*.py file whose get_config() is locked, so an override of a key it lacks is refused."""
  config_flags.DEFINE_config_file("config", None, help_text, lock_config=True)


def config_name() -> str:
  """The --config file's name without folder or .py, e.g. 'demo' (runs/<name> is a run's default workdir)."""
  return os.path.basename(config_flags.get_config_filename(flags.FLAGS["config"])).removesuffix(".py")


def parse_flags(argv):
  """absl's parser, with a mistyped flag or --config.key reported in one line."""
  try:
    return flags.FLAGS(argv)
  except (AttributeError, KeyError, TypeError, ValueError, flags.Error) as e:
    message = str(e).replace("\\'", "'").replace("\\n", " ")  # ml_collections nests a repr in its errors
    if len(message) > 1 and message[0] == message[-1] == "'":
      message = message[1:-1]
    sys.exit(f"error: bad flag: {' '.join(message.split())}")


def run(main, required=()) -> None:
  """app.run(main) through parse_flags, after marking `required` flags as such (a missing one is one line too)."""
  if required:
    flags.mark_flags_as_required(list(required))
  app.run(main, flags_parser=parse_flags)
