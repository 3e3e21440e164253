"""Predicts the train step's time of a config's network under each strategy and the fastest placement searched, on
N GPUs of a host or several hosts, from per-layer kernel times measured on one H200 and NCCL's ring costs
(alexnet_jax/measure/step_model.py, docs/step_model.md); first it checks the model against every recorded step.

  python scripts/step_model.py --config configs/alexnet_2gpu.py [--devices 2,4,8] [--hosts 1] [--link nvlink4]
      [--network ib_ndr] [--per_device_batch 128 | --batch 1024] [--nochecks] [--json OUT.json]
  python scripts/step_model.py --png docs/results/step_model_scaling.png

--png (no --config) predicts SCALING's grid instead: AlexNet and VGG-16 on 1, 2, 4, 8 GPUs of a host and 2, 4, 8
hosts of 8, each named strategy and the searched placement, at each network's per-GPU batch, beside the measured
AlexNet rows at that batch; it prints VGG-16's one-GPU checks and the table, and draws the plot to FILE.

--devices are GPUs per host, --hosts the host counts (each pair a row group: devices × hosts GPUs). Runs on CPU in
seconds: nothing is compiled, shapes come from the layer table. Prints markdown; --json writes the checks and the
predictions.
"""

import dataclasses
import json
import sys

from absl import flags

from alexnet_jax import cli

cli.define_config("a configs/*.py file")
flags.DEFINE_list("devices", ["2"], "GPUs per host, one or more")
flags.DEFINE_list("hosts", ["1"], "host counts, one or more")
flags.DEFINE_string("link", "nvlink4", "the link between a host's GPUs: nvlink4, pcie5, ib_ndr, eth100")
flags.DEFINE_string("network", "ib_ndr", "the link between hosts (one NIC per GPU): ib_ndr, eth100, …")
flags.DEFINE_integer("per_device_batch", 128, "images per GPU (the global batch grows with the GPUs)")
flags.DEFINE_integer("batch", None, "a global batch for every device count instead of --per_device_batch")
flags.DEFINE_float("overlap", None, "share of the gradient all-reduces hidden behind the backward pass (default: "
                   "the fitted one)")
flags.DEFINE_bool("checks", True, "print the model's predictions of every recorded step beside the measured ones")
flags.DEFINE_string("json", None, "write the checks and the predictions here")
flags.DEFINE_string("png", None, "predict SCALING's grid (AlexNet and VGG-16) and draw it here, instead of --config")

# The scaling figure: (label, profiled network, images per GPU); the GPUs as (GPUs a host, hosts).
SCALING = (("AlexNet", "alexnet", 128), ("VGG-16", "vgg16", 32))
SCALING_GPUS = ((1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (8, 4), (8, 8))
# The raw files of measured AlexNet steps at its per-GPU batch (step_model.CHECKS' rows), each at its own commit.
MEASURED = ("bench_one_h200_2026-12-02_lrn_pool.json", "scaling_h200_n2_b128.json")


def check_table(checks) -> str:
  lines = ["| raw file | system | global batch | GPUs | one-GPU step of | measured images/s | predicted | error |",
           "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: |"]
  lines += [f"| {c.file} | {c.system} | {c.batch} | {c.devices} | {c.baseline} | {c.measured:,.0f} | "
            f"{c.predicted:,.0f} | {c.error:+.1%}{' (fit)' if c.fitted else ''} |" for c in checks]
  worst = max(checks, key=lambda c: abs(c.error))
  return "\n".join(lines + ["", f"largest error {worst.error:+.1%} ({worst.file}, {worst.system}, {worst.batch}); "
                                "(fit): the rows the overlap and the collectives' cost were chosen on"])


def prediction_rows(searched, config_row) -> list[tuple[str, object]]:
  rows = [(name, p) for name, p in searched.named.items()]
  if config_row is not None:
    rows.append(("the config's places", config_row))
  return rows + [("searched", searched.best)]


def scaling_table(results) -> str:
  lines = ["| GPUs (hosts) | global batch | placement | mesh data × model | step ms | images/s | compute ms | "
           "collectives ms (exposed) | MiB moved | GiB a GPU (est.) |",
           "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
  for r in results:
    for name, p in prediction_rows(r["searched"], r["config"]):
      lines.append(f"| {r['gpus']} ({r['hosts']}) | {r['batch']} | {name} | {p.data} × {p.model} | {p.step_ms:.3f} | "
                   f"{p.images_per_s:,.0f} | {p.compute_ms:.3f} | {p.comm_ms:.3f} | {p.bytes / 2**20:,.1f} | "
                   f"{p.memory_bytes / 2**30:.2f} |")
  lines.append("\nThe fastest placement searched, as config places ({layer: place}, with --config.strategy=table and "
               "the mesh beside it):\n")
  for r in results:
    best = r["searched"].best
    gpus, hosts = plural(r["gpus"], "GPU"), plural(r["hosts"], "host")
    lines.append(f"- {gpus} ({hosts}), mesh.data={best.data} mesh.model={best.model}: {best.places} "
                 f"({r['searched'].tried} placements tried)")
  return "\n".join(lines)


def plural(n: int, word: str) -> str:
  return f"{n} {word}{'s' if n > 1 else ''}"


def record(p) -> dict:
  out = dataclasses.asdict(p) | dict(bytes=p.bytes)
  out["traffic"] = [dict(layer=k[0], kind=k[1], participants=k[2], bytes=v) for k, v in p.traffic.items()]
  return out


def predictions(args, table) -> list[dict]:
  from alexnet_jax.measure import step_model  # noqa: PLC0415

  kwargs = dict(network=args.network) | ({} if args.overlap is None else dict(overlap=args.overlap))
  results = []
  for hosts in [int(h) for h in args.hosts]:
    for per_host in [int(d) for d in args.devices]:
      gpus = per_host * hosts
      batch = args.batch or args.per_device_batch * gpus
      searched = step_model.search(table, gpus, batch, args.link, hosts=hosts, **kwargs)
      config_row = (step_model.predict(table, "table", gpus, batch, args.link, hosts=hosts, **kwargs)
                    if args.config.strategy == "table" else None)
      results.append(dict(gpus=gpus, hosts=hosts, batch=batch, searched=searched, config=config_row))
  return results


def measured_points(per_gpu: int) -> dict:
  """{(GPUs, strategy): the check (measured images/s, and predicted at its commit's one-GPU step)} of MEASURED's
  rows at `per_gpu` images a GPU."""
  from alexnet_jax.measure import step_model  # noqa: PLC0415

  return {(c.devices, step_model.STRATEGY_OF[c.system]): c for c in step_model.checks(files=MEASURED)
          if c.batch == per_gpu * c.devices}


def scaling(link: str = "nvlink4", network: str = "ib_ndr") -> list[dict]:
  """SCALING's grid: one row per network, GPU count and placement (the named strategies, then the searched)."""
  from alexnet_jax.measure import step_model  # noqa: PLC0415

  rows = []
  for label, name, per_gpu in SCALING:
    table, measured = step_model.profiled_table(name), measured_points(per_gpu) if name == "alexnet" else {}
    for per_host, hosts in SCALING_GPUS:
      gpus = per_host * hosts
      searched = step_model.search(table, gpus, per_gpu * gpus, link, hosts=hosts, network=network)
      for placement, p in [*searched.named.items(), ("searched", searched.best)]:
        rows.append(dict(network=label, gpus=gpus, hosts=hosts, per_gpu=per_gpu, placement=placement, p=p,
                         measured=measured.get((gpus, placement))))
  return rows


def scaling_markdown(rows) -> str:
  lines = ["| network | GPUs (hosts) | per-GPU batch | global batch | placement | mesh data × model "
           "| predicted step ms | predicted images/s | measured images/s (predicted at its commit) |",
           "| --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
  for r in rows:
    c = r["measured"]
    p, measured = r["p"], f"{c.measured:,.0f} ({c.baseline}: {c.predicted:,.0f})" if c else ""
    lines.append(f"| {r['network']} | {r['gpus']} ({r['hosts']}) | {r['per_gpu']} | {r['per_gpu'] * r['gpus']} | "
                 f"{r['placement']} | {p.data} × {p.model} | {p.step_ms:.3f} | {p.images_per_s:,.0f} | {measured} |")
  return "\n".join(lines)


def draw(rows, path: str) -> None:
  """images/s against GPUs, one panel a network: predictions as lines, measured rows as black crosses."""
  from alexnet_jax.training.pictures import _pyplot  # noqa: PLC0415

  plt = _pyplot()
  labels = [label for label, _, _ in SCALING]
  fig, axes = plt.subplots(1, len(labels), figsize=(6 * len(labels), 4.5))
  for ax, label in zip(axes, labels):
    mine = [r for r in rows if r["network"] == label]
    for placement in dict.fromkeys(r["placement"] for r in mine):
      line = [r for r in mine if r["placement"] == placement]
      ax.plot([r["gpus"] for r in line], [r["p"].images_per_s for r in line], "--" if placement != "searched" else "-",
              marker="o", markersize=3, label=f"{placement} (predicted)")
    seen = [r for r in mine if r["measured"]]
    if seen:
      ax.plot([r["gpus"] for r in seen], [r["measured"].measured for r in seen], "kx", markersize=8,
              label="measured (older kernels)")
    ax.axvline(8, color="grey", linewidth=0.5)  # past it, hosts of 8 GPUs joined by the network
    ax.set(xscale="log", yscale="log", xlabel="GPUs (8 a host past the line)", ylabel="images/s",
           title=f"{label}, {mine[0]['per_gpu']} images a GPU, bf16")
    ax.set_xticks([a * b for a, b in SCALING_GPUS], [str(a * b) for a, b in SCALING_GPUS])
    ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def draw_scaling(args) -> None:
  from alexnet_jax.measure import step_model  # noqa: PLC0415

  try:
    step_model.link(args.link), step_model.link(args.network)
    checks = step_model.one_gpu_checks("vgg16")
    rows = scaling(args.link, args.network)
  except ValueError as e:
    sys.exit(f"error: {e}")
  print("**VGG-16 on one GPU** (bf16, images/s)\n\n" + check_table(checks) + "\n")
  print(f"**Scaling** ({args.link} within a host, {args.network} between hosts; bf16; measured rows at their own "
        "commits)\n\n" + scaling_markdown(rows))
  draw(rows, args.png)


def main(argv):
  del argv
  args = flags.FLAGS
  if args.png:
    return draw_scaling(args)
  if args.config is None:
    sys.exit("error: --config is needed (or --png for the scaling figure)")
  from alexnet_jax.config import network_table  # noqa: PLC0415
  from alexnet_jax.measure import step_model  # noqa: PLC0415

  try:
    if min([int(d) for d in args.devices] + [int(h) for h in args.hosts]) < 1:
      raise ValueError("--devices and --hosts must be positive integers")
    table = network_table(args.config, args.config.dataset.num_classes or 1000)
    step_model.link(args.link), step_model.link(args.network)
    checks = step_model.checks() if args.checks else []
    results = predictions(args, table)
  except ValueError as e:
    sys.exit(f"error: {e}")
  if checks:
    print("**The model against every recorded step** (bf16, images/s)\n\n" + check_table(checks) + "\n")
  print(f"**Predicted** ({args.link} within a host, {args.network} between hosts; bf16, the profiles' dtype)\n")
  print(scaling_table(results))
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(checks=[dataclasses.asdict(c) | dict(error=c.error) for c in checks],
                     predictions=[dict(gpus=r["gpus"], hosts=r["hosts"], batch=r["batch"], tried=r["searched"].tried,
                                       searched=record(r["searched"].best),
                                       **{name: record(p) for name, p in r["searched"].named.items()})
                                  for r in results]), f, indent=1)


if __name__ == "__main__":
  cli.run(main)
