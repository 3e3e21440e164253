"""Predicts the train step's time of a config's network under each strategy and the fastest placement searched, on
N GPUs of a host or several hosts, from per-layer kernel times measured on one H200 and NCCL's ring costs
(alexnet_jax/measure/step_model.py, docs/step_model.md); first it checks the model against every recorded step.

  python scripts/step_model.py --config configs/alexnet_2gpu.py [--devices 2,4,8] [--hosts 1] [--link nvlink4]
      [--network ib_ndr] [--per_device_batch 128 | --batch 1024] [--nochecks] [--json OUT.json]

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


def main(argv):
  del argv
  args = flags.FLAGS
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
  cli.run(main, required=["config"])
