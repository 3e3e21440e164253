"""What XLA made of a compiled step, read from its HLO text: the convolutions' dtypes, the transposes and copies
that move data between layouts, the scatters. scripts/dev/hlo_census.py prints it per benchmark system."""

import collections
import math
import re

from alexnet_jax.measure import hlo, kernel_times

_LINE = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*?)\s([a-z][a-z0-9\-]*)\((.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*)\[([\d,]*)\](?:\{([\d,]*))?")
_OPERAND = re.compile(r"%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


def _array(text: str) -> tuple[str, tuple[int, ...], str] | None:
  """(dtype, dims, minor-to-major layout) of the first array type in `text`."""
  m = _ARRAY.search(text)
  return m and (m.group(1), tuple(int(d) for d in m.group(2).split(",") if d), m.group(3) or "")


def _operand(text: str, types: dict):
  """An operand's type: written before its name (XLA:GPU prints them so), or its instruction's (XLA:CPU)."""
  name = _OPERAND.search(text)
  return _array(text) or (types.get(name.group(1)) if name else None)


def _moves_data(opcode: str, rest: str, layout: str, source: str) -> bool:
  """Whether a copy or transpose reorders memory: a copy between layouts, a transpose that is not a bitcast (its
  result layout, read through the permutation, differs from its operand's)."""
  if opcode == "copy":
    return layout != source
  perm = [int(d) for d in re.search(r"dimensions=\{([\d,]*)\}", rest).group(1).split(",") if d]
  return [perm[int(d)] for d in layout.split(",") if d] != [int(d) for d in source.split(",") if d]


def census(hlo_text: str, layer_names, min_bytes: int, batch: int) -> dict:
  """Convolutions by 'operand dtypes -> result dtype', scatters by opcode, and the transposes and copies of at least
  min_bytes that move data (layer, pass, op, type, bytes, whether an axis is the batch: an activation), in compiled
  HLO text (names are unique in a module)."""
  lines = [m.groups() for line in hlo_text.splitlines() if (m := _LINE.match(line))]
  types = {name: _array(result) for name, result, _, _ in lines}
  convs, scatters, moves = collections.Counter(), collections.Counter(), []
  for _, result, opcode, rest in lines:
    operands = [_operand(part, types) for part in rest.split(")")[0].split(", ")]
    scope = (_OP_NAME.search(rest) or [None, ""])[1]
    if opcode == "convolution" or (opcode == "custom-call" and "$conv" in rest):
      convs[f"{','.join(t[0] for t in operands[:2] if t)} -> {_array(result)[0]}"] += 1
    elif "scatter" in opcode and not opcode.startswith("reduce-scatter"):
      scatters[opcode] += 1
    elif opcode in ("transpose", "copy") and operands and operands[0]:
      dtype, dims, layout = _array(result)
      size = math.prod(dims) * hlo.itemsize(dtype)
      if size >= min_bytes and _moves_data(opcode, rest, layout, operands[0][2]):
        moves.append({"layer": kernel_times.layer_of(scope, layer_names) if scope else "no op_name",
                      "pass": "bwd" if "transpose(" in scope else "fwd", "op": opcode,
                      "type": f"{dtype}[{','.join(map(str, dims))}]{{{layout}}}", "bytes": size,
                      "activation": batch in dims})
  return dict(convolutions=dict(convs), scatters=dict(scatters), layout_changes=moves,
              activation_change_bytes=sum(m["bytes"] for m in moves if m["activation"]),
              layout_change_bytes=sum(m["bytes"] for m in moves))
