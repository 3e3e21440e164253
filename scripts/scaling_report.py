"""Tables and plots how each system scales with devices, from the JSON rows of scripts/benchmark.py runs:

  python scripts/scaling_report.py ROWS.json [ROWS.json …] [--png scaling.png] [--markdown scaling.md]

Rows are grouped by system and dtype; a row that several files hold (same system, dtype, devices and global batch)
is taken from the last of them. For each batch per device the rows share (benchmark.py --per_device_batches), a
table per system and device count: the global batch, images/s, the scaling efficiency (images/s over the device
count × the most images/s on one device of the same implementation at that batch per device), ms per step, GiB per
device and the bytes the collectives move per step; then the global batch that gives each system its most images/s
at each device count. The PNG plots images/s against devices, a line per system and dtype, a panel per batch per
device and one for the best batch. Prints the markdown; failed rows are listed after the tables.
"""

import json
import sys

from absl import flags

from alexnet_jax import cli

flags.DEFINE_string("png", None, "write the plot here")
flags.DEFINE_string("markdown", None, "write the tables here")


def load(paths: list[str]) -> list[dict]:
  rows = {}
  for path in paths:
    try:
      with open(path) as f:
        found = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise ValueError(f"{path}: not a file of benchmark rows ({e})") from None
    if not isinstance(found, list) or not all(isinstance(r, dict) and "system" in r for r in found):
      raise ValueError(f"{path}: not a file of benchmark rows (a JSON list of rows, each with its 'system')")
    for r in found:
      if "error" not in r and r.get("per_device_batch") is None:  # rows of benchmark.py before --per_device_batches
        r["per_device_batch"] = r["batch"] // r["devices"]
      rows[r["system"], r["dtype"], r.get("devices"), r.get("batch") or r.get("per_device_batch")] = r
  return list(rows.values())


def _line(r: dict) -> tuple[str, str]:
  return r["system"], r["dtype"]


def best_batches(rows: list[dict]) -> list[dict]:
  """Per system, dtype and device count, the row of the most images/s."""
  best = {}
  for r in rows:
    key = (*_line(r), r["devices"])
    if key not in best or r["images_per_s"] > best[key]["images_per_s"]:
      best[key] = r
  return list(best.values())


def _impl(r: dict) -> tuple[str, str]:
  return r["system"].split(":")[0], r["dtype"]


def one_device(rows: list[dict]) -> dict[tuple[str, str], float]:
  """{(implementation, dtype): the most images/s of its one-device rows}. On one device every layout runs the same
  step (all towers there, nothing to exchange), so the fastest of them is the one-device figure to scale."""
  one = {}
  for r in rows:
    if r["devices"] == 1:
      one[_impl(r)] = max(one.get(_impl(r), 0.0), r["images_per_s"])
  return one


def with_efficiency(rows: list[dict]) -> list[dict]:
  """Each row with `efficiency`: its images/s over devices × its implementation's one-device figure (one_device;
  None without one)."""
  one = one_device(rows)
  return [r | dict(efficiency=r["images_per_s"] / (r["devices"] * one[_impl(r)]) if _impl(r) in one else None)
          for r in rows]


def _largest(r: dict) -> str:
  if not r["collective_bytes"]:
    return "—"
  what, size = max(r["collective_bytes"].items(), key=lambda kv: kv[1])
  return f"{what} {size / 2**20:,.1f}"


def table(rows: list[dict], title: str) -> list[str]:
  lines = [f"\n**{title}**", "", "| system | dtype | devices | global batch | images/s | efficiency | ms/step | "
           "GiB/device | MiB/step moved | largest collective (MiB) |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
  for r in sorted(with_efficiency(rows), key=lambda r: (*_line(r), r["devices"])):
    memory = f"{r['peak_gib']:.2f}" if r.get("peak_gib") is not None else f"step {r['step_gib']:.2f}"
    efficiency = "—" if r["efficiency"] is None else f"{r['efficiency']:.0%}"
    lines.append(f"| {r['system']} | {r['dtype']} | {r['devices']} | {r['batch']} | {r['images_per_s']:,.0f} | "
                 f"{efficiency} | {r['step_ms']:.2f} | {memory} | {sum(r['collective_bytes'].values()) / 2**20:,.1f} | "
                 f"{_largest(r)} |")
  return lines


BEST = "best batch"
TITLES = {BEST: "The global batch of the most images/s, per system and device count"}


def panels(rows: list[dict]) -> dict[str, list[dict]]:
  """{title: rows} of each plot panel and table: one per batch per device, and the best batches."""
  per_device = sorted({r["per_device_batch"] for r in rows})
  return {f"batch {b} per device": [r for r in rows if r["per_device_batch"] == b] for b in per_device} | {
      BEST: best_batches(rows)}


def markdown(rows: list[dict]) -> str:
  done = [r for r in rows if "error" not in r]
  lines = []
  for title, group in panels(done).items():
    lines += table(group, TITLES.get(title, title.capitalize()))
  if failed := [r for r in rows if "error" in r]:
    lines += ["", "Not run:"] + [f"- {r['system']} {r['dtype']} on {r.get('devices') or 'all'} devices, batch "
                                 f"{r.get('batch') or str(r.get('per_device_batch')) + ' per device'}: {r['error']}"
                                 for r in failed]
  return "\n".join(lines).lstrip("\n")


def plot(rows: list[dict], path: str) -> None:
  import matplotlib  # noqa: PLC0415

  matplotlib.use("Agg")  # files only, no display
  import matplotlib.pyplot as plt  # noqa: PLC0415

  done = [r for r in rows if "error" not in r]
  groups = panels(done)
  several_dtypes = len({r["dtype"] for r in done}) > 1
  fig, axes = plt.subplots(1, len(groups), figsize=(5 * len(groups), 4), squeeze=False)
  for ax, (title, group) in zip(axes[0], groups.items()):
    one = one_device(group)  # where every line of an implementation's layouts starts
    for line in sorted({_line(r) for r in group}):
      points = sorted((r["devices"], r["images_per_s"]) for r in group if _line(r) == line)
      impl = (line[0].split(":")[0], line[1])
      if points[0][0] != 1 and impl in one:
        points.insert(0, (1, one[impl]))
      ax.plot(*zip(*points), marker="o", label=" ".join(line) if several_dtypes else line[0])
    counts = sorted({r["devices"] for r in group})
    ax.set_xscale("log", base=2)
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set(title=title, xlabel="devices", ylabel="images/s")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  paths = argv[1:]
  try:
    if not paths:
      raise ValueError("name the JSON files of benchmark.py rows (--json) to report on")
    rows = load(paths)
    if not [r for r in rows if "error" not in r]:
      raise ValueError(f"no row of {', '.join(paths)} was timed (each has an error)")
  except ValueError as e:
    sys.exit(f"error: {e}")
  text = markdown(rows)
  print(text)
  if flags.FLAGS.markdown:
    with open(flags.FLAGS.markdown, "w") as f:
      f.write(text + "\n")
  if flags.FLAGS.png:
    plot(rows, flags.FLAGS.png)


if __name__ == "__main__":
  cli.run(main)
