"""Times the train step of two trees of this project against each other on one machine, in turns: what a change did
to the speed, as docs/BENCHMARKS.md's before/after rows state it.

  python scripts/dev/ab_benchmark.py --before REV_OR_DIR [--after DIR] [--rounds 2] [--json OUT.json]
      -- --config configs/alexnet_1gpu.py --dtypes bfloat16 --batches 128,512 --systems auto:one

Each round runs scripts/benchmark.py with the arguments after `--` once in each tree, before then after, and the next
round after then before, so that a drift of the machine's speed falls on both; each tree has a compilation cache of
its own (its kernels differ). --before is a git revision of this checkout (exported to a temporary folder) or a
folder holding a tree of the project (where there is no git: a copy made with `git archive`); --after is this tree
by default. Prints per row (config, system, devices, dtype, batch) each tree's images/s, the median of its rounds,
the ratio after/before and the largest spread between a tree's rounds; --json writes that with every round's rows,
anew after each run, so that a run that fails loses none before it.
"""

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def exported(rev: str, into: str) -> str:
  """This checkout's tree at git revision `rev`, written below `into`."""
  archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", rev], capture_output=True)
  if archive.returncode:
    sys.exit(f"error: --before {rev!r} is neither a folder nor a git revision of {ROOT}: "
             f"{archive.stderr.decode().strip()}")
  tree = os.path.join(into, "before")
  with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
    tar.extractall(tree, filter="data")
  return tree


def checked(tree: str) -> str:
  """`tree` as an absolute path, once a run there imports the project from it, not an installed copy (a folder
  without the project would otherwise time the installed one, unsaid)."""
  tree = os.path.abspath(tree)
  where = subprocess.run([sys.executable, "-c", "import alexnet_jax; print(alexnet_jax.__file__)"], cwd=tree,
                         env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True)
  found = where.stdout.strip()
  if where.returncode or not found.startswith(os.path.join(tree, "")):
    sys.exit(f"error: {tree} holds no tree of this project: a run there imports alexnet_jax from "
             f"{found or 'nowhere'}")
  return tree


def timed(tree: str, name: str, args: list[str], work: str, round_: int) -> list[dict]:
  """benchmark.py's rows for `args` in `tree`, run there with the tree on the path and a cache of its own."""
  out = os.path.join(work, f"{name}_{round_}.json")
  run = subprocess.run([sys.executable, "scripts/benchmark.py", *args, f"--json={out}",
                        f"--compilation_cache={os.path.join(work, 'cache_' + name)}"], cwd=tree,
                       env={**os.environ, "PYTHONPATH": tree}, capture_output=True, text=True)
  if not os.path.exists(out):
    raise RuntimeError(f"{name}'s benchmark.py wrote no rows: {(run.stderr.strip().splitlines() or ['?'])[-1]}")
  with open(out) as f:
    return json.load(f)


def compared(rounds: list[dict]) -> list[dict]:
  """One row per (config, system, devices, dtype, batch) timed in both trees: each tree's median images/s over its
  rounds, the ratio after/before, and the largest relative gap between one tree's rounds."""
  rates = {}
  for r in rounds:
    for row in r["rows"]:
      if "error" not in row:
        key = (row["config"], row["system"], row["devices"], row["dtype"], row["batch"])
        rates.setdefault(key, {"before": [], "after": []})[r["tree"]].append(row["images_per_s"])
  rows = []
  for (config, system, devices, dtype, batch), by_tree in rates.items():
    if by_tree["before"] and by_tree["after"]:
      before, after = statistics.median(by_tree["before"]), statistics.median(by_tree["after"])
      spread = max((max(v) - min(v)) / min(v) for v in by_tree.values())
      rows.append(dict(config=config, system=system, devices=devices, dtype=dtype, batch=batch, before=before,
                       after=after, ratio=after / before, rounds_spread=spread))
  return rows


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--before", required=True, help="a git revision of this checkout, or a folder with a tree")
  parser.add_argument("--after", default=ROOT, help="a folder with a tree (default: this one)")
  parser.add_argument("--rounds", type=int, default=2, help="runs of each tree, in turns")
  parser.add_argument("--json", help="write the comparison and every round's rows here")
  args, benchmark_args = parser.parse_known_args()
  benchmark_args = [a for a in benchmark_args if a != "--"]
  if args.rounds < 1 or not benchmark_args:
    sys.exit("error: --rounds must be at least 1, and benchmark.py's arguments follow `--` (--config … at least)")
  if any(a.startswith(("--json", "--compilation_cache")) for a in benchmark_args):
    sys.exit("error: --json and --compilation_cache are this script's own: give --json before `--`")

  def save(rounds: list[dict]) -> None:  # after every run: a later one that fails loses none of them
    if args.json:
      with open(args.json, "w") as f:
        json.dump(dict(before=args.before, after=args.after, benchmark_args=benchmark_args, rows=compared(rounds),
                       rounds=rounds), f, indent=1)

  rounds = []
  with tempfile.TemporaryDirectory() as work:
    trees = dict(before=checked(args.before if os.path.isdir(args.before) else exported(args.before, work)),
                 after=checked(args.after))
    for k in range(args.rounds):
      for name in ("before", "after") if k % 2 == 0 else ("after", "before"):
        print(f"round {k + 1}: {name} ({trees[name]})", flush=True)
        try:
          rounds.append(dict(round=k + 1, tree=name, rows=timed(trees[name], name, benchmark_args, work, k + 1)))
        except RuntimeError as e:
          sys.exit(f"error: {e}" + (f" (the runs before it are in {args.json})" if args.json and rounds else ""))
        save(rounds)
  rows = compared(rounds)
  print(f"\n{'config':14} {'system':12} {'dev':>3} {'dtype':9} {'batch':>5} {'before':>9} {'after':>9} "
        f"{'after/before':>12} {'spread':>6}")
  for r in rows:
    print(f"{r['config']:14} {r['system']:12} {r['devices']:3d} {r['dtype']:9} {r['batch']:5d} {r['before']:9,.0f} "
          f"{r['after']:9,.0f} {r['ratio']:12.3f} {r['rounds_spread']:6.1%}")
  print(f"images/s, the median of {args.rounds} round(s) a tree; spread: the largest gap between one tree's rounds")
  if not rows:
    sys.exit("error: no row was timed in both trees (the rounds' rows say why)")


if __name__ == "__main__":
  main()
