"""Training metrics to TensorBoard event files and to metrics.jsonl, one JSON object per line, in the workdir.

metrics.jsonl is only ever appended to, a whole line per write, and holds valid JSON: a NaN or infinite value is
written as null. A run that resumes cuts the file after the last line it keeps (it trains the later steps again); a
half-written last line, left by a run that died mid-write, is cut off with a warning; a run that starts from
scratch keeps the earlier history as metrics.jsonl.1 (.2, …).

TensorBoard's events are written by this thread, each log's at once and flushed: a full disk fails the write that
meets it, which stops the run in one line (workdirs.py), where tensorboardX's SummaryWriter would meet it in a
thread of its own and again at exit, with a traceback each time.
"""

import json
import logging
import math
import os
import time

from tensorboardX import summary
from tensorboardX.event_file_writer import EventsWriter
from tensorboardX.proto.event_pb2 import Event, SessionLog

JSONL = "metrics.jsonl"


class MetricsError(ValueError):
  """metrics.jsonl holds a line that is not a JSON object, before its last line."""


def _scan(path: str) -> list[tuple[int, dict | None]]:
  """(offset after the line, the line's object or None if it is not one) for each line of a metrics.jsonl."""
  rows, offset = [], 0
  with open(path, "rb") as f:
    for line in f:
      offset += len(line)
      try:
        row = json.loads(line) if line.endswith(b"\n") else None
      except ValueError:
        row = None
      rows.append((offset, row if isinstance(row, dict) and "step" in row else None))
  return rows


def read(path: str) -> list[dict]:
  """The rows of a metrics.jsonl, without a half-written last line; MetricsError names any other bad line."""
  rows = _scan(path)
  for number, (_, row) in enumerate(rows[:-1], 1):
    if row is None:
      raise MetricsError(f"{path} line {number} is not a JSON object of a step: remove or fix that line")
  return [row for _, row in rows if row is not None]


def _free_name(path: str) -> str:
  n = 1
  while os.path.exists(f"{path}.{n}"):
    n += 1
  return f"{path}.{n}"


def _finite(value):
  return None if isinstance(value, float) and not math.isfinite(value) else value


class MetricWriter:
  """Writes scalars under '<split>/<name>'. On resume, JSONL lines past the resumed step (written after the last
  checkpoint by a run that stopped) are cut off, since those steps are trained again."""

  def __init__(self, workdir: str, resume_step: int = 0):
    os.makedirs(workdir, exist_ok=True)
    self.jsonl = os.path.join(workdir, JSONL)
    if os.path.exists(self.jsonl):
      self._keep_until(resume_step)
    os.makedirs(os.path.join(workdir, "tensorboard"), exist_ok=True)
    self.events = EventsWriter(os.path.join(workdir, "tensorboard", "events"))
    if resume_step:  # TensorBoard hides the earlier files' events from this step on: the resumed run trains them again
      self.events.write_event(Event(step=resume_step, session_log=SessionLog(status=SessionLog.START)))

  def _keep_until(self, step: int) -> None:
    """Cuts metrics.jsonl before its first line past `step`, in place; a run from scratch moves the file aside
    instead."""
    scanned = _scan(self.jsonl)
    read(self.jsonl)  # refuses a bad line before the last
    if scanned and scanned[-1][1] is None:
      logging.warning("%s: dropped its half-written last line", self.jsonl)
      scanned.pop()
    if step == 0 and scanned:
      aside = _free_name(self.jsonl)
      os.rename(self.jsonl, aside)
      logging.warning("no checkpoint to resume from: the earlier metrics are kept in %s", aside)
      return
    cut = 0  # the end of the last line kept
    for end, row in scanned:
      if row["step"] > step:
        break
      cut = end
    os.truncate(self.jsonl, cut)

  def write(self, split: str, step: int, scalars: dict) -> None:
    now = time.time()
    for name, value in scalars.items():
      self.events.write_event(Event(wall_time=now, step=step, summary=summary.scalar(f"{split}/{name}", value)))
    self.events.flush()
    row = {k: _finite(v) for k, v in dict(step=step, split=split, **scalars).items()}
    with open(self.jsonl, "a") as f:
      f.write(json.dumps(row, allow_nan=False) + "\n")

  def note(self, step: int, message: str) -> None:
    """A line of words about the run at `step` (a warning): a row of split 'note' in metrics.jsonl, and TensorBoard
    text."""
    self.events.write_event(Event(wall_time=time.time(), step=step, summary=summary.text("note", message)))
    self.events.flush()
    with open(self.jsonl, "a") as f:
      f.write(json.dumps(dict(step=step, split="note", message=message)) + "\n")

  def write_config(self, config) -> None:
    self.events.write_event(Event(wall_time=time.time(), step=0,
                                  summary=summary.text("config", "```\n" + str(config) + "\n```")))
    self.events.flush()

  def close(self) -> None:
    self.events.close()
