"""Our Triton kernels as XLA's own Triton custom call, `__gpu$xla.gpu.triton` (what Pallas's Triton backend emits).

jax-triton launches a kernel through jaxlib's `triton_kernel_call`, a legacy (non-FFI) custom call: XLA can put no
such call in a command buffer (CUDA graph; xla/service/gpu/transforms/command_buffer_scheduling.cc takes custom
calls only as FFI handlers marked compatible), so every kernel of ours splits the step's graphs and is launched on
its own, with host work per launch. Given the kernel's Triton IR instead, XLA compiles it itself into a kernel thunk
like its fusions' — one that command buffers take. Triton's own front end (the pip `triton`, as jax-triton uses)
writes the IR, specialised as jax-triton specialises it (every tl.constexpr fixed, pointers 16-byte aligned), and
jaxlib's Triton dialect reads it back: XLA then runs its Triton pipeline (TTIR → PTX) on it.

config.triton_call picks the path ('jax_triton' or 'xla'), for the whole process (config.apply_process_settings).
"""

import functools
import io

import numpy as np

# Triton's name of each element type a kernel's pointer may point to.
_TRITON_TYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64", "int8": "i8",
                 "uint8": "u8", "int16": "i16", "int32": "i32", "int64": "i64", "bool": "i1"}
HOPPER = 90  # the compute capability lowered for when no CUDA device is present (export, CPU tests)


def compute_capability() -> int:
  """The first CUDA device's compute capability as Triton writes it (90 for 9.0), or HOPPER without one."""
  import jax  # noqa: PLC0415

  try:
    return int(float(jax.devices("cuda")[0].compute_capability) * 10)
  except RuntimeError:  # no CUDA backend in this process
    return HOPPER


def pointer_args(kernel) -> list[str]:
  """The kernel's arguments that are not tl.constexpr: its operands' pointers, then its outputs'."""
  return [p.name for p in kernel.params if not p.is_constexpr]


@functools.cache
def _ttir_text(kernel, pointers: tuple[tuple[str, str], ...], constexprs: tuple, num_warps: int, num_stages: int,
               capability: int) -> str:
  from triton.backends.compiler import GPUTarget  # noqa: PLC0415  (Triton is imported only when a kernel is)
  from triton.compiler import ASTSource  # noqa: PLC0415
  from triton.compiler.compiler import make_backend  # noqa: PLC0415
  from triton._C.libtriton import ir  # noqa: PLC0415

  target = GPUTarget("cuda", capability, 32)
  backend = make_backend(target)
  options = backend.parse_options(dict(num_warps=num_warps, num_stages=num_stages))
  names, types = [p.name for p in kernel.params], dict(pointers)
  signature = {n: types.get(n, "constexpr") for n in names}
  source = ASTSource(kernel, signature, constexprs={(names.index(n),): v for n, v in constexprs},
                     attrs={(names.index(n),): [["tt.divisibility", 16]] for n in types})
  context = ir.context()
  ir.load_dialects(context)
  backend.load_dialects(context)
  module = source.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(),
                          context)
  # Triton's own TTIR passes, as its compile() runs them first: the @triton.jit helpers inlined (no tt.call left
  # for XLA's pipeline), the IR canonicalised.
  return str(backend.make_ttir(module, {}, options, capability))


def ttir(launch, dtypes, capability: int | None = None) -> str:
  """The Triton IR (text) of `launch` (a triton_kernels Launch) for pointers to `dtypes`: its operands', then its
  outputs', in the order of the kernel's non-constexpr arguments."""
  names = pointer_args(launch.kernel)
  if len(names) != len(dtypes):
    raise ValueError(f"{launch.kernel.__name__}: {len(names)} pointer arguments ({', '.join(names)}) for "
                     f"{len(dtypes)} operands and outputs")
  missing = {p.name for p in launch.kernel.params if p.is_constexpr} - set(launch.constexprs)
  if missing:
    raise ValueError(f"{launch.kernel.__name__}: no value for tl.constexpr {', '.join(sorted(missing))}")
  pointers = tuple((n, "*" + _TRITON_TYPES[np.dtype(d).name]) for n, d in zip(names, dtypes))
  return _ttir_text(launch.kernel, pointers, tuple(sorted(launch.constexprs.items())), launch.num_warps,
                    launch.num_stages, capability or compute_capability())


def bytecode(text: str) -> bytes:
  """The IR as MLIR bytecode of jaxlib's Triton dialect (XLA's), which is what the custom call carries."""
  from jax._src.interpreters import mlir  # noqa: PLC0415
  from jax._src.lib.mlir import ir  # noqa: PLC0415
  from jax._src.lib.triton import dialect  # noqa: PLC0415

  context = ir.Context()
  context.append_dialect_registry(mlir.upstream_dialects)
  dialect.register_dialect(context)
  context.load_all_available_dialects()
  with context:
    module = ir.Module.parse(text)
    out = io.BytesIO()
    module.operation.write_bytecode(out)
  return out.getvalue()


def lower(ctx, launch, operands, out_avals) -> list:
  """Emits `launch` on `operands` (MLIR values of ctx.avals_in) as one `__gpu$xla.gpu.triton` call returning arrays
  of `out_avals`."""
  from jax._src.interpreters import mlir  # noqa: PLC0415
  from jax._src.lib.mlir import ir  # noqa: PLC0415

  avals = [*ctx.avals_in, *out_avals]
  code = bytecode(ttir(launch, [a.dtype for a in avals]))
  grid = (*launch.grid, 1, 1)[:3]
  config = dict(name=ir.StringAttr.get(mlir.sanitize_name(launch.kernel.__name__)), ir=ir.StringAttr.get(code),
                num_stages=mlir.i32_attr(launch.num_stages), num_warps=mlir.i32_attr(launch.num_warps),
                grid_x=mlir.i32_attr(grid[0]), grid_y=mlir.i32_attr(grid[1]), grid_z=mlir.i32_attr(grid[2]),
                debug=ir.BoolAttr.get(False))
  layouts = [tuple(range(len(a.shape) - 1, -1, -1)) for a in avals]  # row-major, as the kernels index them
  types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in out_avals]
  return mlir.custom_call("__gpu$xla.gpu.triton", result_types=types, operands=list(operands),
                          backend_config=config, api_version=4, operand_layouts=layouts[:len(operands)],
                          result_layouts=layouts[len(operands):]).results
