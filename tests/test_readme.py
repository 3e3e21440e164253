"""README.md's commands as a newcomer types them: in a new shell, after the README's setup line that activates .venv,
in a directory laid out as a clone (the repo's files linked in), on a small image folder of their own."""

import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, ".venv")
# What makes the README's runs small enough for CI, appended to the lines that train: the same config at a tiny
# width and crop, and a few steps.
TINY = ["--config.num_steps=4", "--config.warmup_steps=1", "--config.width=0.0625", "--config.image_size=64",
        "--config.eval_every_steps=4", "--config.checkpoint_every_steps=4", "--config.batch_size=8",
        "--config.eval_batch_size=6"]

pytestmark = pytest.mark.skipif(os.path.realpath(sys.prefix) != os.path.realpath(VENV),
                                reason="the README's setup activates .venv: these tests run in it (make test)")


def blocks(language: str) -> list[str]:
  """The README's fenced code blocks of `language` ('' for the unmarked ones), in order."""
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  return [b for lang, b in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if lang == language]


def commands() -> list[str]:
  """The README's shell lines, comments dropped."""
  return [line.split("  #")[0].strip() for block in blocks("") for line in block.splitlines() if line.strip()]


def photos(root) -> None:
  """root/photos/{train,val}/<class>/: JPEGs of two classes a network tells apart at once (light and dark), and a
  PNG among them."""
  rng = np.random.default_rng(0)
  for split, count in (("train", 8), ("val", 3)):
    for name, level in (("dark", 40), ("light", 215)):
      os.makedirs(root / "photos" / split / name)
      for i in range(count):
        h, w = rng.integers(90, 160, 2)
        pixels = np.clip(level + rng.normal(0, 25, (h, w, 3)), 0, 255).astype(np.uint8)
        suffix = "png" if i == 0 else "jpg"
        Image.fromarray(pixels).save(root / "photos" / split / name / f"{i}.{suffix}")


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
  """A directory laid out as a clone that ran `make train`/`make test` (the repo's files and .venv linked in),
  with the newcomer's photos/."""
  root = tmp_path_factory.mktemp("clone")
  for name in (".venv", "Makefile", "pyproject.toml", "constraints.txt", "README.md", "alexnet_jax", "configs",
               "scripts", "triton_kernels"):
    os.symlink(os.path.join(ROOT, name), root / name)
  photos(root)
  return root


def shell(root, command: str, timeout=600) -> subprocess.CompletedProcess:
  """`command` in a new bash in `root`, after the README's setup line, in an environment without .venv on its PATH,
  as a new terminal is."""
  (setup,) = [c for c in commands() if c.startswith("source ")]
  path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(VENV))
  env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")} | dict(PATH=path)
  return subprocess.run(["bash", "-c", f"{setup} && {command}"], cwd=root, env=env, capture_output=True, text=True,
                        timeout=timeout)


def ok(run: subprocess.CompletedProcess) -> str:
  assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
  return run.stdout


def test_a_new_shell_without_the_setup_line_has_no_python_of_ours(clone):
  # What a newcomer met before the README said how to reach .venv: the system's Python, without the package.
  assert any(c == "source .venv/bin/activate" for c in commands())
  bare = subprocess.run(["bash", "-c", "command -v python >/dev/null && python -c 'import alexnet_jax' || exit 3"],
                        cwd=clone, env=dict(PATH="/usr/bin:/bin"), capture_output=True, text=True)
  assert bare.returncode != 0
  assert ok(shell(clone, "python -c 'import alexnet_jax, sys; print(sys.prefix)'")).strip() == VENV


def test_your_own_images_and_the_run_s_commands_as_printed(clone):
  lines = commands()
  prepare = next(c for c in lines if c.startswith("make prepare"))
  printed = ok(shell(clone, prepare)).splitlines()
  # What prepare prints is the README's training line, with nothing more this folder needs.
  train_line = next(c for c in lines if c.startswith("python scripts/train.py --config configs/own_images.py"))
  (printed_train,) = [p.strip() for p in printed if p.strip().startswith("python scripts/train.py")]
  assert shlex.split(printed_train)[:4] == shlex.split(train_line)[:4]
  assert printed_train.replace(str(clone) + "/", "") == train_line
  out = ok(shell(clone, f"{train_line} {shlex.join(TINY)}"))
  assert "final eval" in out
  run = lines.index(train_line)
  for line in lines[run + 1:]:
    if line.startswith("python scripts/"):
      out = ok(shell(clone, line))
      if "predict.py" in line and "--json" not in line:  # every image of photos/val, its class folders descended
        named = [row.split(": ")[0] for row in out.strip().splitlines()]
        assert sorted(named) == sorted(f"photos/val/{c}/{i}.{'png' if i == 0 else 'jpg'}"
                                       for c in ("dark", "light") for i in range(3))
      if "evaluate.py" in line:
        assert "top-1 accuracy" in out and re.search(r"^\s+10\s+6\s", out, re.M)
  with open(clone / "predictions.json") as f:
    assert len(json.load(f)) == 6
  (python,) = blocks("python")
  out = ok(shell(clone, f"python -c {shlex.quote(python)}"))
  classes, top, evaluated = out.strip().splitlines()
  assert classes == "('dark', 'light')"
  assert len(eval(top)) == 6 and evaluated.startswith("{")  # noqa: S307  (our own printed Python values)
