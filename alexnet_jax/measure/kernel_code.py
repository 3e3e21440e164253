"""What a kernel primitive's Triton kernel compiles to for a GPU, on a machine without one: its registers, spills,
shared memory, the widths of its global loads and stores, its tensor-core instructions and its loops' instructions,
read from the machine code (SASS) that Triton's own ptxas and nvdisasm produce. What a profile cannot say of a slow
kernel, and what its docstring promises (16-byte vectors a thread, tensor cores for 16-bit inputs), checked without
the GPU.

The kernel is compiled as jax-triton compiles it for the primitive's lowering: the same launch (`KernelSpec.launch`),
every pointer 16-byte aligned (XLA's buffers are, and jax-triton says so to Triton), the operands in the dtypes the
kernel reads them in (`KernelSpec.reads`) followed by its outputs.
"""

import collections
import dataclasses
import os
import re
import subprocess
import tempfile

import jax
import numpy as np

from alexnet_jax.ops.kernel import KernelPrimitive

TRITON_TYPES = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "int8": "*i8", "int32": "*i32"}
HOPPER = 90  # the compute capability compiled for by default: the H100's and H200's


@dataclasses.dataclass(frozen=True)
class KernelCode:
  kernel: str
  registers: int  # a thread's
  local_bytes: int  # a thread's local memory: registers spilled, or arrays the compiler could not keep in registers
  shared_bytes: int  # a program's (Triton's pipeline buffers)
  memory: dict  # each global load and store opcode of the code (e.g. 'LDG.E.128', 'STG.E.U16') → how often it occurs
  mma: int  # tensor-core instructions (Hopper's warpgroup HGMMA, or HMMA)
  # each loop's body, in order: (instructions, of them register copies (MOV, IMAD.MOV), of them global loads into
  # registers (LDG): what the loop waits on, where the pipeline's asynchronous copies (LDGSTS) are not)
  loops: tuple

  def widest(self, op: str) -> int:
    """The widest access in bits of the opcodes starting `op` ('LDG', 'STG'); 0 where there are none."""
    return max((access_bits(o) for o in self.memory if o.startswith(op)), default=0)


def access_bits(opcode: str) -> int:
  """Bits one thread moves with a global load or store opcode: LDG.E.128 → 128, LDG.E.U16 → 16, LDG.E → 32."""
  sizes = [int(m) for m in re.findall(r"\.[US]?(8|16|32|64|128)\b", opcode)]
  return sizes[-1] if sizes else 32


def compiled(primitive: KernelPrimitive, *avals, arch: int = HOPPER, **params) -> KernelCode:
  """The code of `primitive`'s kernel for operands `avals` (jax.ShapeDtypeStruct) and the primitive's `params`
  (those of a bind, without `mode`), compiled for compute capability `arch`."""
  import triton  # noqa: PLC0415  (the kernels' own Triton, with its CUDA tools; imported where it is used)
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415
  from triton.compiler import ASTSource  # noqa: PLC0415

  spec = primitive.spec
  launch = spec.launch(*avals, **params)
  reads = spec.reads(*avals, **params) if spec.reads else [a.dtype for a in avals]
  read = [jax.ShapeDtypeStruct(a.shape, d) for a, d in zip(avals, reads)]
  reads = [a.dtype for a in (spec.kernel_args(*read, **params) if spec.kernel_args else read)]
  writes = [o.dtype for o in (spec.kernel_outputs or spec.outputs)(*avals, **params)]
  pointers = iter(TRITON_TYPES[np.dtype(d).name] for d in [*reads, *writes])
  fn = launch.kernel
  signature = {name: "constexpr" if name in launch.constexprs else next(pointers) for name in fn.arg_names}
  source = ASTSource(fn=fn, signature=signature,
                     constexprs={(i,): launch.constexprs[n] for i, n in enumerate(fn.arg_names)
                                 if n in launch.constexprs},
                     attrs={(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
                            if signature[n] != "constexpr"})
  kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options=dict(num_warps=launch.num_warps, num_stages=launch.num_stages))
  return read_cubin(fn.__name__, kernel.asm["cubin"], kernel.metadata.shared)


def read_cubin(name: str, cubin: bytes, shared_bytes: int) -> KernelCode:
  """KernelCode of a compiled kernel, through the CUDA tools that Triton's NVIDIA backend carries."""
  import triton.backends.nvidia  # noqa: PLC0415

  tools = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin")
  with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
    f.write(cubin)
    f.flush()
    usage = subprocess.run([os.path.join(tools, "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                           check=True).stdout
    sass = subprocess.run([os.path.join(tools, "nvdisasm"), f.name], capture_output=True, text=True,
                          check=True).stdout
  resources = dict(re.findall(r"\b(REG|LOCAL):(\d+)", usage))
  opcodes, labels, loops = [], {}, []
  for line in sass.splitlines():
    if label := re.match(r"\s*\.(L_x_\d+):", line):
      labels[label.group(1)] = len(opcodes)
    elif instruction := re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)(.*)", line):
      opcodes.append(instruction.group(1))
      target = re.search(r"`\(\.(L_x_\d+)\)", instruction.group(2))
      if opcodes[-1].startswith("BRA") and target and labels.get(target.group(1), len(opcodes)) < len(opcodes) - 1:
        body = opcodes[labels[target.group(1)]:]  # a branch back (not the exit's branch to itself): a loop's body
        loops.append((len(body), sum(o.startswith(("MOV", "IMAD.MOV")) for o in body),
                      sum(o.startswith("LDG.") for o in body)))
  return KernelCode(name, int(resources["REG"]), int(resources["LOCAL"]), shared_bytes,
                    dict(collections.Counter(o for o in opcodes if re.match(r"(LDG|LDGSTS|STG)\.", o))),
                    sum(o.startswith(("HGMMA", "HMMA")) for o in opcodes), tuple(loops))
