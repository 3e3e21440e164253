"""Checkpoints that cannot be read, or that go while they are read, and saves that fail (docs/reliability.md): a
warning and the one before, one line naming the steps and what to do, never advice to move good checkpoints, and a
run that ends in bounded time. The tiny run and its fixtures are tests/test_reliability.py's."""

import errno
import logging
import os
import shutil
import subprocess
import sys
import time

import pytest
from test_reliability import (  # noqa: F401  (finished, template, tiny_file: fixtures)
    CORRUPTIONS, ROOT, _start, _wait_for_training, finished, template, tiny_config, tiny_file)

from alexnet_jax.training import checkpoints


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_an_unreadable_newest_checkpoint_falls_back_to_the_one_before(finished, template, tmp_path, corruption,
                                                                     caplog):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished[0], workdir)
  CORRUPTIONS[corruption](os.path.join(workdir, "checkpoints", "10"))
  with caplog.at_level(logging.WARNING):
    state, position = checkpoints.restore(checkpoints.existing(workdir, tiny_config()), template)
  assert int(state.step) == 8 and position["next_batch"] == 8
  assert [r.getMessage().split(" (")[0] for r in caplog.records if r.name == "root"] == [
      f"checkpoint 10 in {workdir}/checkpoints cannot be restored"]
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["10", "4", "8"]  # nothing deleted


def test_no_readable_checkpoint_stops_naming_them(finished, template, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished[0], workdir)
  for step in ("4", "8", "10"):
    CORRUPTIONS["emptied step directory"](os.path.join(workdir, "checkpoints", step))
  with pytest.raises(checkpoints.CheckpointError, match=f"none of the checkpoints in {workdir}/checkpoints can be "
                     r"restored \(steps 10, 8, 4;"):
    checkpoints.restore(checkpoints.manager(workdir, tiny_config()), template, set_aside=True)
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["10", "4", "8"]  # left as they were


def test_a_reader_never_advises_moving_checkpoints_away(finished, template, tmp_path):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished[0], workdir)
  for step in ("4", "8", "10"):
    CORRUPTIONS["emptied step directory"](os.path.join(workdir, "checkpoints", step))
  with pytest.raises(checkpoints.CheckpointError, match="if a run is still saving in that workdir, rerun") as e:
    checkpoints.restore(checkpoints.existing(workdir, tiny_config()), template)
  assert "move" not in str(e.value)


def test_a_checkpoint_rotated_away_while_read_is_followed_to_the_newer_one(finished, template, tmp_path, caplog):
  # A run saving every step and keeping one replaces step 10 by 11 between the reader's listing and its read: the
  # reader lists the steps again rather than calling the vanished one unreadable.
  workdir = str(tmp_path / "run")
  shutil.copytree(finished[0], workdir)
  directory = os.path.join(workdir, "checkpoints")
  for step in ("4", "8"):
    shutil.rmtree(os.path.join(directory, step))
  mngr = checkpoints.existing(workdir, tiny_config())
  assert mngr.all_steps() == [10]
  os.rename(os.path.join(directory, "10"), os.path.join(directory, "11"))
  with caplog.at_level(logging.WARNING):
    state, position = checkpoints.restore(mngr, template)
  assert int(state.step) == 10 and position["next_batch"] == 10  # the same numbers, now under the name 11
  assert not [r for r in caplog.records if "cannot be restored" in r.getMessage()]


def test_reading_while_a_run_rotates_its_checkpoints_every_step_always_restores(tmp_path, tiny_file, template,
                                                                                caplog):
  workdir = tmp_path / "run"
  process = _start(["scripts/train.py", "--config", tiny_file, "--workdir", str(workdir), "--config.num_epochs=6",
                    "--config.checkpoint_every_steps=1", "--config.checkpoints_to_keep=1"])
  _wait_for_training(process)
  steps = []
  try:
    while process.poll() is None and len(steps) < 25:
      if os.path.isdir(workdir / "checkpoints") and any(n.isdigit() for n in os.listdir(workdir / "checkpoints")):
        state, _ = checkpoints.restore(checkpoints.existing(str(workdir), tiny_config()), template)
        steps.append(int(state.step))
  finally:
    process.communicate(timeout=120)
  assert process.returncode == 0 and len(steps) >= 5 and steps == sorted(steps), steps
  assert not [r for r in caplog.records if "cannot be restored" in r.getMessage()]  # gone is not unreadable


def test_a_checkpoints_file_in_the_workdir_is_refused_before_training(tmp_path, tiny_file):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "checkpoints").write_text("x")
  run = subprocess.run([sys.executable, "scripts/train.py", "--config", tiny_file, "--workdir", str(workdir)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 1
  assert run.stderr.strip().splitlines()[-1] == (
      f"error: {workdir}/checkpoints is not a directory, and the run saves its checkpoints there: move it away, or "
      "train in another --workdir")
  assert (workdir / "checkpoints").read_text() == "x"


def test_a_save_that_fails_leaving_orbax_waiting_ends_the_run_in_bounded_time(tmp_path, tiny_file):
  # checkpoints/ replaced by a file while the run trains: orbax's first save fails, and its threads then wait for
  # signals the failed save never sends; the script still ends, with the one line that says why.
  workdir = tmp_path / "run"
  process = _start(["scripts/train.py", "--config", tiny_file, "--workdir", str(workdir),
                    "--config.checkpoint_every_steps=1000", "--config.num_epochs=3"])
  _wait_for_training(process)
  shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
  (workdir / "checkpoints").write_text("x")
  started = time.monotonic()
  _, stderr = process.communicate(timeout=120)
  assert process.returncode == 1 and time.monotonic() - started < 60
  assert stderr.strip().splitlines()[-1] == (
      f"error: cannot save a checkpoint in {workdir}/checkpoints: NotADirectoryError: [Errno 20] Not a directory: "
      f"'{workdir}/checkpoints/30.orbax-checkpoint-tmp'; make that path a writable directory, then rerun the same "
      "command to resume from the last checkpoint")


@pytest.mark.parametrize("error,remedy", [
    (OSError(errno.ENOSPC, "No space left on device"), "free space, then rerun"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), "a file of the checkpoint went while it was "
                                                                  "written (another process removing it?)"),
    (ValueError("os_error_code='2' [tensorstore_spec…]"), "a file of the checkpoint went while it was written"),
    (ValueError("Invalid argument"), "then rerun the same command")])
def test_a_failed_save_names_its_cause_not_always_a_full_disk(error, remedy):
  assert checkpoints._remedy(error).startswith(remedy)
