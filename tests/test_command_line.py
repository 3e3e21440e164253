"""What the scripts say when a run's files or the command line are wrong (docs/reliability.md): a broken config
file, a run.json that training could not have written, an unknown workdir, an output that cannot be written, a
terminal in ASCII, each in one line. The tiny run and its fixtures are tests/test_reliability.py's."""

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from test_reliability import ROOT, finished, tiny_file  # noqa: F401  (finished, tiny_file: fixtures)

from alexnet_jax.training import run as run_file


@pytest.mark.parametrize("content,message", [
    (None, "error: no config file {path}"),
    ("def get_config(:\n", "error: config file {path}, line 1: SyntaxError: invalid syntax"),
    ("import no_such_module\n", "error: config file {path}, line 1: ModuleNotFoundError: No module named"),
    ("def get_config():\n  return 1 / 0\n", "error: config file {path}, line 2: ZeroDivisionError: division by zero"),
    ("x = 1\n", "error: config file {path}: it defines no get_config()"),
    ("def get_config():\n  return dict(learning_rate=0.1)\n", "error: config file {path}: get_config() returned a "
     "dict, not an ml_collections.ConfigDict: return alexnet_jax.config.paper_config() with your changes"),
    ("def get_config():\n  c = 1\n", "error: config file {path}: get_config() returned None, not an "
     "ml_collections.ConfigDict: is its return statement missing?"),
    ("def get_config(size):\n  return size\n", "error: config file {path}: get_config() missing 1 required "
     "positional argument: 'size': the scripts call get_config() without arguments"),
    ("def get_config():\n  return 1\x00\n", "error: config file {path}: SyntaxError: source code string cannot "
     "contain null bytes"),
    ("import sys\ndef get_config():\n  sys.exit(3)\n",
     "error: config file {path}, line 3: it calls sys.exit(3) instead of returning a config"),
    # A typo of a key: ml_collections' "did you mean", without the whole config it lists after it.
    ("from alexnet_jax.config import paper_config\ndef get_config():\n  c = paper_config()\n  c.lerning_rate = 1\n",
     'error: config file {path}, line 4: AttributeError: Key "lerning_rate" does not exist and cannot be added since '
     'the config is locked. Did you mean "learning_rate" instead of "lerning_rate"?'),
])
def test_a_missing_or_broken_config_file_gives_one_line(tmp_path, content, message):
  path = tmp_path / "config.py"
  if content is not None:
    path.write_text(content)
  run = subprocess.run([sys.executable, "scripts/train.py", "--config", str(path), "--workdir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert run.returncode == 1
  assert run.stderr.strip().splitlines() == [run.stderr.strip()]
  assert run.stderr.strip().startswith(message.format(path=path)) and len(run.stderr) < 300


def test_a_terminal_in_ascii_gets_escapes_not_an_error(tmp_path, tiny_file):
  # The C locale: Python's standard streams in ASCII, as PYTHONIOENCODING=ascii would make them.
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONIOENCODING", "LC_ALL", "LANG", "PYTHONUTF8")}
  encoding = dict(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
  run = subprocess.run([sys.executable, "scripts/train.py", "--config", tiny_file, "--workdir", str(tmp_path / "run"),
                        "--config.num_epochs=0.2"], cwd=ROOT, capture_output=True, timeout=300, env=env | encoding)
  assert run.returncode == 0, run.stderr[-2000:]
  assert b"steps 0\\u21922, workdir" in run.stdout and b"final eval: top-1" in run.stdout  # → as \u2192


RUN_JSON_DAMAGE = {
    "a list": (lambda d: [], "it holds a JSON list, not the object training writes"),
    "a string": (lambda d: "run", "it holds a JSON str, not the object training writes"),
    "3 of 10 classes": (lambda d: _set(d, "classes", ["a", "b", "c"]),
                        "dataset.classes names 3 classes (3 different) for the 10 outputs of the network"),
    "classes as a string": (lambda d: _set(d, "classes", "abcdefghij"),
                            "dataset.classes is str 'abcdefghij', not a list of names"),
    "a class twice": (lambda d: _set(d, "classes", ["a"] * 10),
                      "dataset.classes names 10 classes (1 different) for the 10 outputs"),
    "std 0": (lambda d: _set(d, "statistics", dict(d["dataset"]["statistics"], std=[0, 0, 0])),
              "dataset.statistics.std is [0.0, 0.0, 0.0]: the images are divided by it, so each must be above 0"),
    "mean of 2": (lambda d: _set(d, "statistics", dict(d["dataset"]["statistics"], mean=[0.5, 0.5])),
                  "dataset.statistics.mean is [0.5, 0.5]: 3 finite numbers expected"),
}


def _set(description, key, value):
  description["dataset"][key] = value
  return description


@pytest.mark.parametrize("damage", RUN_JSON_DAMAGE)
def test_a_run_json_that_training_could_not_have_written_is_refused_in_one_line(finished, tmp_path, damage):
  workdir = tmp_path / "run"
  shutil.copytree(finished[0], workdir)
  change, message = RUN_JSON_DAMAGE[damage]
  (workdir / "run.json").write_text(json.dumps(change(json.load(open(workdir / "run.json")))))
  with pytest.raises(ValueError, match=re.escape(f"{workdir}/run.json cannot be read (ValueError: {message}")):
    run_file.read(str(workdir))
  if damage == "a list":  # the scripts say it in one line
    for script, more in (("evaluate.py", []), ("predict.py", [str(workdir)]), ("export.py", ["--out", "x"])):
      result = subprocess.run([sys.executable, f"scripts/{script}", "--workdir", str(workdir), *more],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
      assert result.returncode == 1 and result.stderr.strip().splitlines() == [
          f"error: {workdir}/run.json cannot be read (ValueError: {message}): it is not what training wrote"]


@pytest.mark.parametrize("script", ["evaluate.py", "visualize.py", "export.py", "predict.py"])
def test_read_only_scripts_refuse_an_unknown_workdir_and_create_nothing(tmp_path, script):
  typo = tmp_path / "rnus" / "demo"
  more = {"export.py": ["--out", str(tmp_path / "x")], "predict.py": [ROOT]}.get(script, [])
  run = subprocess.run([sys.executable, f"scripts/{script}", "--workdir", str(typo), *more], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert run.returncode == 1
  assert run.stderr.strip().splitlines()[-1] == f"error: --workdir {typo} is not a directory: pass the workdir of a " \
                                                "training run"
  assert "Traceback" not in run.stderr and os.listdir(tmp_path) == []


@pytest.mark.parametrize("script", ["evaluate.py", "visualize.py", "export.py"])
def test_scripts_that_cannot_write_their_output_say_so_in_one_line(finished, tmp_path, script):
  workdir = str(tmp_path / "run")
  shutil.copytree(finished[0], workdir)
  os.remove(os.path.join(workdir, "curves.png"))
  os.mkdir(os.path.join(workdir, "curves.png"))  # visualize cannot write its picture over a directory
  where = {"evaluate.py": ["--out", "/proc/alexnet_jax_eval.json"], "visualize.py": [],
           "export.py": ["--out", "/proc/alexnet_jax.artifact"]}[script]
  run = subprocess.run([sys.executable, f"scripts/{script}", "--workdir", workdir, *where], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
  assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
  last = run.stderr.strip().splitlines()[-1]
  assert last.startswith("error: ") and (where[-1] if where else "curves.png") in last, last
  if script == "evaluate.py":  # what it computed is not lost
    assert last.endswith("; the results are above") and "top-1 accuracy" in run.stdout
