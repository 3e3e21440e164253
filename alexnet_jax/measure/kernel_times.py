"""Per-kernel times of traced train steps, from the Chrome/Perfetto JSON that `jax.profiler.trace(dir,
create_perfetto_trace=True)` writes (dir/plugins/profile/<run>/perfetto_trace.json.gz), read with the compiled HLO
of the traced program, which names each op's layer (its op_name path) and kind.

Which events are device work: on a GPU, every event on the device's stream lines ("/device:GPU:0", threads
"Stream #…": kernels, memcpys, NCCL); on a TPU, its "XLA Ops" line (failing both, every line that the profiler
does not derive from others); on the CPU, the thunks that XLA:CPU runs on
host threads (events with an `hlo_op` argument; the device is their `device_ordinal`). Of events nested on one
thread only the innermost count, so no time is counted twice. Busy time is the union of a device's events, wall
time the span from its first event's start to its last event's end; both per step.
"""

import collections
import dataclasses
import glob
import gzip
import json
import os
import re

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all", "send", "recv")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*.*?\s([a-z][a-z0-9\-]*)\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")  # a computation's first line, at column 0
_CALLS = re.compile(r"calls=%?([\w.\-]+)")


@dataclasses.dataclass(frozen=True)
class HloOp:
  opcode: str
  kind: str  # what the op is, for grouping: 'triton kernel', 'collective', 'gemm', 'conv', 'fusion', 'copy', …
  scope: str  # the op_name path of the JAX code that made it


@dataclasses.dataclass(frozen=True)
class Event:
  device: str
  thread: tuple
  name: str  # the kernel's (GPU) or thunk's (CPU) name
  hlo_op: str
  start: float  # µs
  dur: float  # µs


def _kind(opcode: str, line: str) -> str:
  target = (_TARGET.search(line) or [None, ""])[1]
  if any(opcode.startswith(c) for c in COLLECTIVES):
    return "collective"
  if target == "triton_kernel_call":
    return "triton kernel (ours)"
  if "cublas" in target or opcode == "dot" or "__triton_gemm" in line or "__cublas" in line:
    return "gemm"
  if "cudnn" in target.lower() or opcode == "convolution" or "__cudnn" in line:
    return "conv"
  if opcode in ("copy", "transpose", "copy-start", "copy-done"):
    return "copy"
  return opcode


def hlo_ops(hlo_text: str) -> dict[str, HloOp]:
  """Every instruction of compiled HLO text by name: its opcode, kind and op_name. A fusion without an op_name of
  its own (XLA leaves it off multi-output fusions) takes the first one in the computation it calls."""
  ops, calls, first_scope, computation = {}, {}, {}, None
  for line in hlo_text.splitlines():
    if m := _COMPUTATION.match(line):
      computation = m.group(1)
      continue
    if m := _INSTRUCTION.match(line):
      name, opcode = m.groups()
      scope = _OP_NAME.search(line)
      ops[name] = HloOp(opcode, _kind(opcode, line), scope.group(1) if scope else "")
      if scope:
        first_scope.setdefault(computation, scope.group(1))
      if callee := _CALLS.search(line):
        calls[name] = callee.group(1)
  for name, callee in calls.items():
    if not ops[name].scope and callee in first_scope:
      ops[name] = dataclasses.replace(ops[name], scope=first_scope[callee])
  return ops


def newest_trace(trace_dir: str) -> dict:
  """The newest perfetto_trace.json.gz that jax.profiler.trace wrote under trace_dir."""
  found = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "perfetto_trace.json.gz")),
                 key=os.path.getmtime)
  if not found:
    raise ValueError(f"no perfetto_trace.json.gz under {trace_dir}/plugins/profile: trace with "
                     "jax.profiler.trace(dir, create_perfetto_trace=True)")
  with gzip.open(found[-1]) as f:
    return json.load(f)


def device_events(trace: dict) -> list[Event]:
  """The device work in a trace (see the module docstring), innermost events only."""
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  processes = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
  threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "thread_name"}
  complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
  device_pids = {pid for pid, name in processes.items() if name.startswith("/device:")}
  by_pid = collections.defaultdict(set)
  for e in complete:
    if e["pid"] in device_pids:
      by_pid[e["pid"]].add(threads.get((e["pid"], e.get("tid")), ""))
  wanted = {pid: _work_lines(lines) for pid, lines in by_pid.items()}
  picked = []
  for e in complete:
    args, thread = e.get("args", {}), threads.get((e["pid"], e.get("tid")), "")
    if e["pid"] in device_pids:
      if thread not in wanted[e["pid"]]:
        continue
      device = processes[e["pid"]].removeprefix("/device:")
    elif not device_pids and "hlo_op" in args:  # XLA:CPU runs its thunks on host threads
      device = f"CPU:{args.get('device_ordinal', 0)}"
    else:
      continue
    picked.append(Event(device, (e["pid"], e.get("tid")), e["name"], args.get("hlo_op", ""), float(e["ts"]),
                        float(e["dur"])))
  return _innermost(picked)


# Lines that the profiler derives from the device's own (steps, modules, ops spanning their kernels): counted, they
# would count the same time twice.
DERIVED_LINES = ("XLA Modules", "XLA Ops", "Steps", "Launch Stats", "Framework Ops", "Framework Name Scope",
                 "Source code", "TensorFlow Ops", "TensorFlow Name Scope")


def _work_lines(lines: set) -> set:
  """A device's lines of work: its streams (GPU), else its "XLA Ops" (TPU), else every line not derived."""
  streams = {t for t in lines if t.startswith("Stream")}
  return streams or ({"XLA Ops"} & lines) or {t for t in lines if t not in DERIVED_LINES}


def _innermost(events: list[Event]) -> list[Event]:
  by_thread = collections.defaultdict(list)
  for e in events:
    by_thread[e.thread].append(e)
  kept = []
  for evs in by_thread.values():
    evs.sort(key=lambda e: (e.start, -e.dur))
    for i, e in enumerate(evs):
      following = evs[i + 1] if i + 1 < len(evs) else None
      if not (following and following.start < e.start + e.dur and following.start + following.dur <= e.start + e.dur):
        kept.append(e)
  return kept


def _union(intervals) -> float:
  total, end = 0.0, float("-inf")
  for start, stop in sorted(intervals):
    if stop > end:
      total += stop - max(start, end)
      end = stop
  return total


def layer_of(scope: str, layer_names) -> str:
  """The table layer whose name is a component of an op_name path, or 'outside the network' (input crops, loss,
  optimizer)."""
  parts = set(re.split(r"[/():;]", scope))
  return next((n for n in layer_names if n in parts), "outside the network")


def summarise(events: list[Event], ops: dict[str, HloOp], layer_names, steps: int) -> dict:
  """Per device: busy and wall ms per step, event count per step, and the time per step of each (layer, pass, kind)
  group with its kernels, largest first; ms per step by kind across layers."""
  by_kernel_name = {re.sub(r"[.\-]", "_", name): op for name, op in ops.items()}
  out = {}
  for device in sorted({e.device for e in events}):
    evs = [e for e in events if e.device == device]
    groups = collections.defaultdict(lambda: dict(us=0.0, calls=0, kernels=collections.Counter()))
    kinds = collections.Counter()
    for e in evs:
      # A kernel without its op's name (as in a CUDA graph) is named after its fusion, with '.' and '-' as '_'.
      op = ops.get(e.hlo_op) or ops.get(e.name) or by_kernel_name.get(e.name)
      kind = op.kind if op else ("memcpy" if "memcpy" in e.name.lower() else "other")
      if "nccl" in e.name.lower():
        kind = "collective"
      scope = op.scope if op else ""
      layer = layer_of(scope, layer_names) if scope else "no op_name" if op else "no HLO op"
      key = (layer, "bwd" if "transpose(" in scope else "fwd", kind)
      g = groups[key]
      g["us"] += e.dur
      g["calls"] += 1
      g["kernels"][e.name] += e.dur
      kinds[kind] += e.dur
    busy = _union((e.start, e.start + e.dur) for e in evs)
    wall = max(e.start + e.dur for e in evs) - min(e.start for e in evs)
    rows = [{"layer": layer, "pass": direction, "kind": kind, "ms": g["us"] / steps / 1e3, "calls": g["calls"] / steps,
             "kernels": {k: v / steps / 1e3 for k, v in g["kernels"].most_common()}}
            for (layer, direction, kind), g in groups.items()]
    rows.sort(key=lambda r: -r["ms"])
    out[device] = dict(busy_ms=busy / steps / 1e3, wall_ms=wall / steps / 1e3, events=len(evs) / steps,
                       kernel_ms=sum(e.dur for e in evs) / steps / 1e3,
                       by_kind={k: v / steps / 1e3 for k, v in kinds.most_common()}, groups=rows)
  return out
