"""Triton kernels as JAX primitives.

A `KernelPrimitive` makes one kernel of triton_kernels/ a `jax.extend.core.Primitive`:
- abstract eval from the op's output shapes, keeping the operands' varying manual axes, which shard_map's
  check_vma needs (jax-triton's own primitive drops them);
- lowering: with mode='triton', on CUDA, the kernel through `jax_triton.triton_call` (imported there: it fails to
  import on a CPU-only jaxlib); with mode='fastest', on CUDA, the kernel or, where a measured table has XLA's own
  computation of the same outputs faster at these shapes (`KernelSpec.xla_faster`), that (`KernelSpec.xla`): a
  convolution's three directions each choose; with mode='interpret', on any platform, the real kernel under the
  Triton interpreter in a host callback, which is how the CPU tests run the kernels. A primitive has no XLA lowering
  for other platforms: an op that must run everywhere picks its XLA reference there (`backend.dispatch`);
- batching: a vmapped axis of batch-last operands folds into their image axis N (what CHWN is good at); any other
  batching maps over the vmapped axis;
- differentiation, for a kernel linear in each of two operands (`def_bilinear`), as lax builds its dot and
  convolution: a JVP rule and a transpose rule per operand, so that forward mode (jvp, linearize, jacfwd,
  Hessian-vector products) composes with reverse mode, which is the JVP's linear part transposed; `def_linear` does
  the same for a kernel linear in one operand (a pool), the others constants or nonlinear ones whose derivative
  XLA supplies (`curvature`).
  A kernel nonlinear in its input (LRN) has no transpose: `def_nonlinear` gives it a tangent that XLA computes from
  its reference (`XlaPrimitive`), linear, with the backward kernel as its transpose. A custom VJP would do for
  reverse mode alone; this way reverse mode runs the same two kernels and keeps the same residuals, and forward
  mode composes with it.
"""

import dataclasses
import functools
import importlib
import operator
import os
import pkgutil
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from triton_kernels import interpret  # no Triton import: it runs the kernels that triton_kernels() hands it

MODES = ("triton", "fastest", "interpret")


def triton_kernels():
  """The kernel modules, imported on first use: Triton reads TRITON_INTERPRET when it is first imported, so importing
  alexnet_jax must not import it (a test or script sets the variable first)."""
  import triton_kernels as package  # noqa: PLC0415

  try:  # every module of the package: a new kernel's is found where it lies
    for module in pkgutil.iter_modules(package.__path__):
      importlib.import_module(f"triton_kernels.{module.name}")
  except ModuleNotFoundError as e:  # a ValueError: the scripts report it in one line, as a config's
    raise ValueError(f"the Triton kernels need {e.name}: pip install -e '.[gpu]' (or run with "
                     "--config.kernel_backend=xla)") from None
  return package


@dataclasses.dataclass(frozen=True)
class KernelSpec:
  """What a primitive needs to know of its kernel. Callables take the operands' avals and the primitive's params."""

  launch: Callable  # (*avals, **params) -> triton_kernels.Launch, which carries the kernel
  outputs: Callable  # (*avals, **params) -> [jax.ShapeDtypeStruct]: what the primitive returns
  kernel_outputs: Callable | None = None  # (*avals, **params) -> what the kernel writes, if not `outputs`
  # (*operands, **params) -> the arrays the kernel reads, if not the operands: e.g. a pointer it leaves unread where
  # the primitive has no operand for it, filled by another operand
  kernel_args: Callable | None = None
  finish: Callable | None = None  # (*kernel outputs, **params) -> outputs, e.g. summing split-K partials
  batch_last: tuple[int, ...] = ()  # operands whose last axis is the image axis N, like every output then
  # (*avals, **params) -> the dtype the kernel reads each operand in, where the primitive takes another: the lowering
  # converts it (XLA fuses that into the operand's producer). Narrowing inside the primitive, not before it, returns
  # a gradient in the operand's own dtype: a float32 filter gradient for float32 filters read in bfloat16.
  reads: Callable | None = None
  # mode 'fastest': (*avals, **params) -> whether XLA computes the outputs faster than the kernel at these shapes (a
  # measured table's answer), and (*operands, **params) -> those outputs as XLA computes them, the operands read as
  # the kernel reads them
  xla_faster: Callable | None = None
  xla: Callable | None = None


class KernelPrimitive:
  def __init__(self, name: str, spec: KernelSpec):
    self.spec = spec
    self.prim = Primitive(name)
    self.prim.multiple_results = True
    self.prim.def_impl(lambda *args, **params: self._eager(tuple(sorted(params.items())))(*args))
    self.prim.def_abstract_eval(self._abstract_eval)
    mlir.register_lowering(self.prim, self._lowering(cuda=True), platform="cuda")
    mlir.register_lowering(self.prim, self._lowering(cuda=False))
    batching.primitive_batchers[self.prim] = self._batch

  def __call__(self, *operands, mode: str, **params):
    if mode not in MODES:
      raise ValueError(f"{self.prim.name}: unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return self.prim.bind(*same_varying_axes(operands), mode=mode, **params)

  @functools.cache
  def _eager(self, params: tuple):
    """One compiled program per parameter set for calls outside jit."""
    return jax.jit(lambda *args: self.prim.bind(*args, **dict(params)))

  def _abstract_eval(self, *avals, mode, **params):
    del mode
    # Operands share their varying manual axes (__call__ sees to it), so any one carries them to the outputs.
    return [avals[0].update(shape=o.shape, dtype=o.dtype, weak_type=False) for o in self.spec.outputs(*avals, **params)]

  def _lowering(self, cuda: bool):
    def lower(ctx, *operands, mode, **params):
      avals = ctx.avals_in
      if self.spec.reads:
        avals = [a.update(dtype=d) for a, d in zip(avals, self.spec.reads(*avals, **params))]
      if mode == "interpret":
        fn = self._interpreted(avals, params)
      elif cuda and mode == "fastest" and self.spec.xla_faster and self.spec.xla_faster(*avals, **params):
        fn = functools.partial(self.spec.xla, **params)
      elif cuda:
        fn = self._triton(avals, params)
      else:
        raise ValueError(f"{self.prim.name}: the 'triton' backend needs a CUDA GPU; on this platform use 'auto', "
                         "'xla' or 'interpret'")
      read = lambda *args: fn(*(x.astype(a.dtype) for x, a in zip(args, avals)))  # noqa: E731
      return mlir.lower_fun(read, multiple_results=True)(ctx, *operands)

    return lower

  def _raw_outputs(self, avals, params):
    return (self.spec.kernel_outputs or self.spec.outputs)(*avals, **params)

  def _kernel_args(self, args, params):
    return self.spec.kernel_args(*args, **params) if self.spec.kernel_args else args

  def _finish(self, raw, params):
    return list(self.spec.finish(*raw, **params)) if self.spec.finish else list(raw)

  def _triton(self, avals, params):
    def run(*args):
      try:
        import jax_triton  # noqa: PLC0415  (needs a CUDA jaxlib)
      except ModuleNotFoundError:
        raise ValueError("the Triton kernels on CUDA need jax-triton: pip install -e '.[gpu]' (or run with "
                         "--config.kernel_backend=xla)") from None
      launch = self.spec.launch(*avals, **params)
      raw = jax_triton.triton_call(*self._kernel_args(args, params), kernel=launch.kernel,
                                   out_shape=self._raw_outputs(avals, params), grid=launch.grid,
                                   num_warps=launch.num_warps, num_stages=launch.num_stages, **launch.constexprs)
      return self._finish(raw, params)

    return run

  def _interpreted(self, avals, params):
    if os.environ.get("TRITON_INTERPRET") != "1":
      raise ValueError(f"{self.prim.name}: the 'interpret' backend needs TRITON_INTERPRET=1 in the environment "
                       "before triton is first imported")
    raw_shapes = self._raw_outputs(avals, params)

    def host(*arrays):
      outs = [np.empty(s.shape, s.dtype) for s in raw_shapes]
      interpret.run(self.spec.launch(*avals, **params), *(np.ascontiguousarray(a) for a in arrays), *outs)
      return outs

    return lambda *args: self._finish(jax.pure_callback(host, raw_shapes, *self._kernel_args(args, params)),
                                      params)

  def _batch(self, operands, dims, **params):
    batched = [i for i, d in enumerate(dims) if d is not None]
    size = next(x.shape[d] for x, d in zip(operands, dims) if d is not None)
    if set(batched) <= set(self.spec.batch_last):
      # Fold the vmapped axis into N: (…, N) with a batch axis B becomes (…, B·N); every output is batch-last too.
      folded = []
      for i, (x, d) in enumerate(zip(operands, dims)):
        if i in self.spec.batch_last:
          x = jnp.moveaxis(x, d, -2) if d is not None else jnp.stack([x] * size, axis=-2)
          x = x.reshape(*x.shape[:-2], -1)
        folded.append(x)
      outs = self.prim.bind(*folded, **params)
      outs = [o.reshape(*o.shape[:-1], size, -1) for o in outs]
      return outs, [o.ndim - 2 for o in outs]
    moved = [jnp.moveaxis(x, d, 0) if d is not None else x for x, d in zip(operands, dims)]

    def one(sliced):
      it = iter(sliced)
      return self.prim.bind(*(next(it) if d is not None else x for x, d in zip(moved, dims)),
                            **params)

    outs = jax.lax.map(one, [moved[i] for i in batched])
    return outs, [0] * len(outs)

  def def_bilinear(self, transposes, jvp=None):
    """Differentiation of a one-output kernel linear in each of its first two operands, any others constants.

    transposes[i](ct, *operands, **params) is the cotangent of operand i, an `ad.UndefinedPrimal` (its aval tells
    the shape), with the other known: another kernel, as a convolution's data and filter gradients are. The JVP binds
    the kernel again with each nonzero tangent in its operand's place; `jvp` replaces it for a kernel whose fused
    epilogue (bias, ReLU) is not linear, and must leave only linear calls on the tangents."""
    ad.primitive_jvps[self.prim] = jvp or self._bilinear_jvp
    ad.primitive_transposes[self.prim] = functools.partial(self._bilinear_transpose, transposes)

  def _bilinear_jvp(self, primals, tangents, **params):
    outs = self(*primals, **params)
    terms = [self(*primals[:i], t, *primals[i + 1:], **params)
             for i, t in enumerate(tangents[:2]) if type(t) is not ad.Zero]
    if not terms:
      return outs, [zero_tangent(o) for o in outs]
    return outs, [functools.reduce(operator.add, t) for t in zip(*terms)]

  def _bilinear_transpose(self, transposes, cts, *operands, **params):
    unknown = [ad.is_undefined_primal(x) for x in operands]
    if sum(unknown) != 1 or not any(unknown[:2]):
      raise ValueError(f"{self.prim.name}: transposed with respect to operands {unknown}; it is linear in operand 0 "
                       "or 1 alone")
    i = unknown.index(True)
    cts_out = [None] * len(operands)
    (ct,) = cts
    if type(ct) is not ad.Zero:
      cts_out[i] = transposes[i](ct, *operands, **params).astype(operands[i].aval.dtype)
    return cts_out

  def def_linear(self, transpose, jvp=None, *, linear=0, curvature=None):
    """Differentiation of a one-output kernel linear in operand `linear`, the others constants (a max pool's offsets)
    or, with `curvature`, operands it is nonlinear in (LRN's backward kernel, in x). transpose(ct, *operands,
    **params) is the cotangent of operand `linear`, an `ad.UndefinedPrimal`, the others known. The JVP binds the
    kernel again on that operand's tangent, plus curvature(primals, tangents, **params) → [output tangent] when
    another operand's tangent is nonzero, which only second derivatives meet; `jvp` replaces it all."""
    ad.primitive_jvps[self.prim] = jvp or functools.partial(self._linear_jvp, linear, curvature)
    ad.primitive_transposes[self.prim] = functools.partial(self._linear_transpose, transpose, linear)

  def _linear_jvp(self, linear, curvature, primals, tangents, **params):
    outs = self(*primals, **params)
    terms = []
    if type(tangents[linear]) is not ad.Zero:
      terms.append(self(*primals[:linear], tangents[linear], *primals[linear + 1:], **params))
    if curvature and any(type(t) is not ad.Zero for i, t in enumerate(tangents) if i != linear):
      terms.append(curvature(primals, [ad.instantiate_zeros(t) for t in tangents], **params))
    if not terms:
      return outs, [zero_tangent(o) for o in outs]
    return outs, [functools.reduce(operator.add, t) for t in zip(*terms)]

  def _linear_transpose(self, transpose, linear, cts, *operands, **params):
    unknown = [ad.is_undefined_primal(x) for x in operands]
    if unknown != [i == linear for i in range(len(operands))]:
      raise ValueError(f"{self.prim.name}: transposed with respect to operands {unknown}; it is linear in operand "
                       f"{linear} alone")
    (ct,) = cts
    cts_out = [None] * len(operands)
    if type(ct) is not ad.Zero:
      cts_out[linear] = transpose(ct, *operands, **params).astype(operands[linear].aval.dtype)
    return cts_out


class XlaPrimitive(KernelPrimitive):
  """A primitive that XLA computes, fn(*operands, **params) → outputs, on every platform and in every mode, with a
  kernel's abstract eval, batching and differentiation: a kernel's tangent that needs no kernel of its own but must
  be a primitive for its transpose to be one (its `mode` is the one the transpose's kernel runs in)."""

  def __init__(self, name: str, fn: Callable, outputs: Callable, batch_last: tuple[int, ...] = ()):
    self.fn = fn
    super().__init__(name, KernelSpec(launch=None, outputs=outputs, batch_last=batch_last))

  def _lowering(self, cuda: bool):
    del cuda
    return lambda ctx, *operands, mode, **params: mlir.lower_fun(
        functools.partial(self.fn, **params), multiple_results=True)(ctx, *operands)


def def_nonlinear(fwd: KernelPrimitive, bwd: KernelPrimitive, reference: Callable, name: str) -> XlaPrimitive:
  """Differentiation of a kernel nonlinear in its one operand x; returns the primitive of its tangent.

  fwd(x) → [y, *constants] (a pool's offsets) and bwd(x, dy, *constants) → J(x)ᵀ·dy are kernels of the same
  parameters (but a launch override, one kernel's own); reference(x, *constants, **params) → y is the function in
  XLA, the constants fixed. A custom VJP would hide the pair from forward mode; instead the JVP runs fwd for y and, for
  its tangent, the returned primitive: J(x)·t as XLA differentiates the reference, linear in t, with bwd its
  transpose. So reverse mode runs fwd and bwd alone and keeps x and the constants, the custom VJP's residuals, and
  never the tangent's XLA. bwd and the tangent, each the other's transpose, are nonlinear in x: their derivatives
  there, the reference's second derivatives in XLA, are what Hessian-vector products and second orders add.
  """

  def of_x(params, constants):
    """The reference as a function of x alone, the constants and the kernels' parameters fixed."""
    params = {k: v for k, v in params.items() if k not in ("mode", "launch")}
    return lambda x: reference(x, *constants, **params)

  def tangent_fn(t, x, *constants, **params):
    return [jax.jvp(of_x(params, constants), (x,), (t,))[1]]

  def tangent_curvature(primals, tangents, **params):
    (t, x, *constants), dx = primals, tangents[1]
    return [jax.jvp(lambda x: jax.jvp(of_x(params, constants), (x,), (t,))[1], (x,), (dx,))[1]]

  def bwd_curvature(primals, tangents, **params):
    (x, dy, *constants), dx = primals, tangents[0]
    return [jax.jvp(lambda x: jax.vjp(of_x(params, constants), x)[1](dy)[0], (x,), (dx,))[1]]

  tangent = XlaPrimitive(
      name, tangent_fn, lambda t, x, *c, **p: [jax.ShapeDtypeStruct(fwd.spec.outputs(x, **p)[0].shape, t.dtype)],
      batch_last=bwd.spec.batch_last)  # (t, x, *constants) lie as bwd's (x, dy, *constants)
  untuned = lambda params: {k: v for k, v in params.items() if k != "launch"}  # noqa: E731

  def fwd_jvp(primals, tangents, **params):
    ((x,), (t,)) = primals, tangents
    outs = fwd(x, **params)
    constants = [zero_tangent(c) for c in outs[1:]]
    if type(t) is ad.Zero:
      return outs, [zero_tangent(outs[0]), *constants]
    return outs, [tangent(t, x, *outs[1:], **untuned(params))[0], *constants]

  ad.primitive_jvps[fwd.prim] = fwd_jvp
  tangent.def_linear(lambda ct, t, x, *c, **p: bwd(x, ct, *c, **untuned(p))[0], curvature=tangent_curvature)
  bwd.def_linear(lambda ct, x, dy, *c, **p: tangent(ct, x, *c, **untuned(p))[0], linear=1, curvature=bwd_curvature)
  return tangent


def zero_tangent(x):
  """The symbolic zero tangent of x (float0 for integers, such as a pool's offsets)."""
  return ad.Zero(jax.typeof(x).to_tangent_aval())


def same_varying_axes(operands):
  """Operands of one kernel must vary over the same manual mesh axes; widen those that vary over fewer.

  A primitive's call does it before binding, so that JAX differentiates the widening (its transpose sums the
  gradient of a replicated operand over the devices) and every rule sees operands alike.
  """
  axes = [jax.typeof(x).manual_axis_type.varying for x in operands]
  union = frozenset().union(*axes)
  return [jax.lax.pcast(x, tuple(union - a), to="varying") if union - a else x for x, a in zip(operands, axes)]
