"""Reading the collectives out of compiled HLO text: which layer each belongs to and how many bytes it moves."""

import dataclasses
import math
import re

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_ARRAY = re.compile(r"(\w+)\[([\d,]*)\]")


def itemsize(dtype: str) -> int:
  """Bytes per element of an HLO element type: bf16 2, f32 4, s8 1, pred 1, …"""
  bits = re.match(r"[a-z]+(\d+)", dtype)
  return int(bits.group(1)) // 8 if bits else 1


@dataclasses.dataclass(frozen=True)
class Collective:
  kind: str
  scope: str  # the op_name path of the jax code that made it
  group_size: int  # devices taking part in each group
  bytes: int  # the whole tensor: gathered result, scattered input, or reduced operand
  text: str = dataclasses.field(default="", compare=False, repr=False)  # the HLO line, cut to 300 characters
  # (op_name path, bytes) of each op that XLA combined into this one, in operand order; one part if not combined
  parts: tuple[tuple[str, int], ...] = dataclasses.field(default=(), compare=False, repr=False)
  computation: str = dataclasses.field(default="", compare=False)  # the HLO computation holding it ("ENTRY %main")

  def layers(self, names) -> tuple[str, ...]:
    """Those of `names` that appear as scopes in the op's path, in their order in `names`: one layer for a
    model-parallel exchange, every layer whose gradient it carries for an all-reduce that XLA combined from many
    (data parallelism's), whose path lists the combined ops' paths as "(a:b:…)"."""
    parts = set(re.split(r"[/():]", self.scope))
    return tuple(n for n in names if n in parts)

  def by_layer(self, names, outside=None) -> dict[str, int]:
    """Bytes per layer of `names`: a combined all-reduce split by the ops it combines (each operand's bytes to the
    layer on its path), a layer's own collective whole; an op of no layer to outside[part] for the first part of its
    path that `outside` ({path part: row}) names (the step's scopes, its arguments), else to 'other'."""
    outside, out = outside or {}, {}
    for path, size in self.parts or ((self.scope, self.bytes),):
      found = re.split(r"[/():]", path.replace("\\", ""))
      layer = next((n for n in names if n in found), None) or next((outside[p] for p in found if p in outside),
                                                                    "other")
      out[layer] = out.get(layer, 0) + size
    return out


def _parts(scope: str, sizes: list[int]) -> tuple[tuple[str, int], ...]:
  """A combined op's path is 'prefix/(path:path:…)', one path per operand."""
  start = scope.find("/(")
  paths = scope[start + 2:-1].split(":") if start >= 0 and scope.endswith(")") else []
  return tuple(zip(paths, sizes)) if len(paths) == len(sizes) > 1 else ()


def _operand_count(line: str, kind: str) -> int:
  """How many operands the collective's call lists: `kind(%a, %b)`, or with their types `kind(f32[2]{0} %a, …)`."""
  call = re.search(re.escape(kind) + r"(?:-start)?\(([^)]*)\)", line)
  return call.group(1).count("%") if call else 0


def _group_size(line: str) -> int:
  if m := re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line):  # mesh['data'=1,'model'=2] {'model'}
    sizes = dict(re.findall(r"'(\w+)'=(\d+)", m.group(1)))
    return math.prod(int(sizes[a]) for a in re.findall(r"'(\w+)'", m.group(2)))
  if m := re.search(r"replica_groups=\[[\d,]+\]<=\[[\d,]+\]", line):  # iota form [groups,size]<=[n]
    return int(re.search(r"\[(?:\d+,)*(\d+)\]<=", m.group(0)).group(1))
  if m := re.search(r"replica_groups=\{\{([\d,]*)\}", line):  # explicit {{0,1},{2,3}}
    return len(m.group(1).split(","))
  return 1


_COMPUTATION = re.compile(r"^((?:ENTRY\s+)?%?[\w.\-]+)\s.*\{\s*$")


def collectives(hlo_text: str) -> list[Collective]:
  found, computation = [], ""
  for line in hlo_text.splitlines():
    if header := _COMPUTATION.match(line):
      computation = header.group(1)
      continue
    m = _OP.search(line)
    if not m or "-done(" in line:
      continue
    shape, kind = m.groups()
    sizes = [itemsize(t) * math.prod(int(d) for d in dims.split(",") if d) for t, dims in _ARRAY.findall(shape)]
    group = _group_size(line)
    if f"{kind}-start(" in line and kind in ("all-gather", "reduce-scatter"):
      # An async start returns (operands…, results…): the whole tensor is the results of a gather and the
      # operands of a scatter.
      half = len(sizes) // 2
      size = sum(sizes[half:] if kind == "all-gather" else sizes[:half])
    else:
      if kind == "all-reduce" and len(sizes) == 2 * _operand_count(line, kind):
        sizes = sizes[len(sizes) // 2:]  # an async start as (operands…, results…): each reduced tensor once
      size = sum(sizes) * (group if kind == "reduce-scatter" else 1)
    scope = re.search(r'op_name="([^"]*)"', line)
    scope = scope.group(1) if scope else ""
    parts = _parts(scope, sizes) if kind == "all-reduce" else ()
    found.append(Collective(kind, scope, group, size, line.strip()[:300], parts, computation))
  return found
