"""Portable artifacts of a network (jax.export): serialised StableHLO that any JAX of a compatible version loads and
runs on the platforms it was exported for, without this package's code (except a train step's pytree types).

A file is MAGIC, one line of JSON header (with a SHA-256 of header and payload together, so that `load` refuses a
truncated or altered file), then jax.export's serialisation. Two functions can be exported: 'inference' (logits from
'uint8' stored images or 'chwn' normalised crops, the weights inside) and 'train_step'. What differs between
platforms is chosen by the platform each program is lowered for; a cuda artifact with the Triton kernels needs a
fixed batch and can only be made beside a CUDA GPU. docs/export.md has the format and the inputs. Importing this
module registers a train step's pytree types: import it before `jax.export.deserialize` of a train step (`load` does).
"""

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from alexnet_jax.data.device_batches import random_batch
from alexnet_jax.network import model, sharding
from alexnet_jax.ops.backend import cuda_here
from alexnet_jax.training import step_input, train, workdirs

FUNCTIONS = ("inference", "train_step")
INPUTS = ("uint8", "chwn")
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")
TRITON_CALL = "triton_kernel_call"  # jax-triton's custom call target, one per kernel launch


def _register_pytrees():
  """The train step's argument and result types, under names that stay fixed across versions of this package."""
  for node in (optax.EmptyState, optax.TraceState, optax.ScaleByScheduleState):
    jax.export.register_namedtuple_serialization(node, serialized_name=f"optax.{node.__name__}")

  def auxdata(aux):
    if aux != ():  # a flax.struct dataclass without static fields flattens to no auxiliary data
      raise ValueError(f"TrainState has static fields now ({aux!r}): extend its serialisation")
    return b""

  jax.export.register_pytree_node_serialization(train.TrainState, serialized_name="alexnet_jax.TrainState",
                                                serialize_auxdata=auxdata, deserialize_auxdata=lambda _: ())


_register_pytrees()


def check_platforms(platforms, backend: str) -> tuple[str, ...]:
  """The platforms to lower for, or one ValueError saying why they cannot be exported from here."""
  platforms = tuple(platforms)
  unknown = [p for p in platforms if p not in PLATFORMS]
  if not platforms or unknown:
    raise ValueError(f"export platforms must be some of {', '.join(PLATFORMS)}; got {', '.join(platforms) or 'none'}")
  if backend == "interpret":
    raise ValueError("kernel_backend='interpret' runs the kernels in host callbacks, which an artifact cannot carry: "
                     "export with 'auto', 'xla' or (for cuda) 'triton'")
  if "cuda" in platforms and backend in ("auto", "triton") and not cuda_here():
    raise ValueError("exporting the Triton kernels for cuda needs a CUDA GPU here: jax-triton compiles them at export "
                     "for its compute capability. Export on the GPU machine, or with --config.kernel_backend=xla for "
                     "a cuda program of XLA's own ops")
  return platforms


def _disabled_checks(platforms, backend: str) -> list:
  """jax.export refuses custom calls it does not know to be stable. Our kernels' call carries each kernel compiled
  for the exporting GPU in its payload, so a cuda artifact is tied to that compute capability (docs/export.md), not to a
  jaxlib's internals: that is the check waived, and only where the kernels go into a cuda lowering."""
  if "cuda" in platforms and backend in ("auto", "triton"):
    return [jax.export.DisabledSafetyCheck.custom_call(TRITON_CALL)]
  return []


def _batch(setup: train.Setup, batch_size: int | None, platforms, backend: str):
  """The batch dimension: batch_size, or (None) a symbolic one, which any batch fills, where the program allows it:
  on one device, without the Triton kernels in a cuda lowering (jax-triton compiles each kernel for one shape)."""
  if batch_size is None:
    if setup.mesh.size > 1 or "cuda" in platforms and backend in ("auto", "triton"):
      raise ValueError("a batch of any size needs a one-device mesh and no Triton kernels for cuda: give the batch "
                       "(--batch N), or export for other platforms or with --config.kernel_backend=xla")
    return jax.export.symbolic_shape("batch")[0]
  if batch_size < 1 or batch_size % setup.mesh.size:
    raise ValueError(f"batch size {batch_size} does not split over the mesh's {setup.mesh.size} devices")
  return batch_size


def _batch_split(setup: train.Setup, ndim: int, axis: int = 0) -> NamedSharding:
  """The batch axis `axis` split as training places batches (the setup's batch_layout)."""
  spec = [None] * ndim
  spec[axis] = setup.batch_layout.axes
  return NamedSharding(setup.mesh, P(*spec))


def inference_fn(setup: train.Setup, params, input_kind: str = "uint8"):
  """images → logits (N, classes) float32, in evaluation mode, with `params` closed over (constants when traced)."""
  if input_kind not in INPUTS:
    raise ValueError(f"inference input must be one of {', '.join(INPUTS)}, got {input_kind!r}")
  key = jax.random.key(0)  # no dropout in evaluation: the key is unused
  apply, forward = sharding.sharded_apply(setup.net, setup.mesh), train.logits_fn(setup)

  def logits(images):
    if input_kind == "chwn":
      return apply(params, images, key, False)
    return forward(params, step_input.eval_input(setup, images), key, False)

  return logits


def inference_input(setup: train.Setup, input_kind: str, batch_size: int, size: int) -> jax.ShapeDtypeStruct:
  """The abstract input of inference_fn: `size` is S, the side of the pipeline's uint8 images."""
  s = setup.image_size
  if input_kind == "chwn":
    return jax.ShapeDtypeStruct((3, s, s, batch_size), jnp.float32, sharding=_batch_split(setup, 4, axis=3))
  if size < s:
    raise ValueError(f"{size}-pixel images are smaller than the network's {s}-pixel crop")
  return jax.ShapeDtypeStruct((batch_size, size, size, 3), jnp.uint8, sharding=_batch_split(setup, 4))


def export_inference(setup: train.Setup, params, *, platforms, batch_size: int | None = None,
                     input_kind: str = "uint8", size: int | None = None) -> jax.export.Exported:
  """The inference function of `params` for `platforms`, on batches of `batch_size` (None: any) of images of side
  `size` (default the network's crop)."""
  platforms = check_platforms(platforms, setup.net.backend)
  batch = _batch(setup, batch_size, platforms, setup.net.backend)
  image = inference_input(setup, input_kind, batch, size or setup.image_size)
  return jax.export.export(jax.jit(inference_fn(setup, params, input_kind)), platforms=platforms,
                           disabled_checks=_disabled_checks(platforms, setup.net.backend))(image)


def train_step_args(setup: train.Setup, batch_size, size: int):
  """Abstract (state, batch, key) of train.train_step, each laid out as training lays it out."""
  state = train.train_state_init(setup).eval_shape(jax.random.key(0))
  example = random_batch(1, setup.image_size, 1, size=size)  # the contract's shapes and dtypes
  batch = {k: jax.ShapeDtypeStruct((batch_size, *v.shape[1:]), v.dtype, sharding=_batch_split(setup, v.ndim))
           for k, v in example.items()}
  return state, batch, jax.eval_shape(jax.random.key, 0)


def export_train_step(setup: train.Setup, *, platforms, batch_size: int | None = None,
                      size: int | None = None) -> jax.export.Exported:
  """train.train_step for `platforms`, on training batches of `batch_size` (None: any) images of side `size`
  (default the network's crop)."""
  platforms = check_platforms(platforms, setup.net.backend)
  batch = _batch(setup, batch_size, platforms, setup.net.backend)
  step = jax.jit(functools.partial(train.train_step, setup=setup))
  # XLA:CPU compiles the other platforms' programs too: none may hold a bf16 reduce-scatter (network/model.py).
  wide = model.float32_scatters() if "cpu" in platforms and len(platforms) > 1 else contextlib.nullcontext()
  with wide:
    return jax.export.export(step, platforms=platforms,
                             disabled_checks=_disabled_checks(platforms, setup.net.backend))(
        *train_step_args(setup, batch, size or setup.image_size))


MAGIC = b"alexnet_jax artifact\n"
FORMAT = 2  # 1: the digest was of the payload alone, so the header could be edited unnoticed


@dataclasses.dataclass(frozen=True)
class Artifact:
  """A loaded artifact: `exported` (call it: `artifact.exported.call(images)`), and what it says of itself
  (`facts`: the class names, the pixel statistics the images are normalised with, the stored size, …)."""

  exported: jax.export.Exported
  facts: dict

  @property
  def classes(self) -> tuple[str, ...]:
    return tuple(self.facts.get("classes", ()))


def digest(header: dict, payload: bytes) -> str:
  """The SHA-256 an artifact's header carries: of the header's other keys as JSON (keys sorted, json.dumps' default
  separators), a newline, then the payload. Of the JSON's meaning, not its bytes, so a reader may re-encode it."""
  fields = {k: v for k, v in header.items() if k != "sha256"}
  return hashlib.sha256(json.dumps(fields, sort_keys=True).encode() + b"\n" + bytes(payload)).hexdigest()


def save(exported: jax.export.Exported, path: str, facts: dict) -> int:
  """Writes the artifact — MAGIC, a line of JSON (`facts`, the format, the payload's length, `digest`), then
  jax.export's serialisation — whole or not at all; returns its bytes."""
  if mismatch := _class_mismatch(exported, facts):
    raise ValueError(f"cannot export to {path}: {mismatch}")
  payload = bytes(exported.serialize())
  header = dict(facts, format=FORMAT, payload_bytes=len(payload))
  header["sha256"] = digest(header, payload)
  data = MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload
  workdirs.write_file(path, data)
  return len(data)


def load(path: str) -> Artifact:
  """The artifact at `path`, its header and payload checked against its SHA-256: one ValueError for a file that is
  not one, truncated, altered or of an earlier format, a payload that is not a program, or class names that are not
  one per logit."""
  try:
    with open(path, "rb") as f:
      data = f.read()
  except OSError as e:
    raise ValueError(f"cannot read {path}: {e.strerror or e}") from None
  end = data.find(b"\n", len(MAGIC))
  if not data.startswith(MAGIC) or end < 0:
    raise ValueError(f"{path} is not an alexnet_jax artifact (scripts/export.py writes them)")
  try:
    facts = json.loads(data[len(MAGIC):end])
  except ValueError:
    raise ValueError(f"{path}: its header is not JSON: the file is damaged") from None
  if not isinstance(facts, dict):
    raise ValueError(f"{path}: its header is not a JSON object: the file is damaged")
  payload = data[end + 1:]
  if facts.get("format") != FORMAT:
    raise ValueError(f"{path} is an artifact of format {facts.get('format')!r}, this package reads format {FORMAT} "
                     "(its digest covers the header too): export it again with scripts/export.py")
  if len(payload) != facts.get("payload_bytes") or digest(facts, payload) != facts.get("sha256"):
    raise ValueError(f"{path} is damaged: its header or program is not what it was written with (truncated or "
                     "altered); export it again")
  exported = _deserialize(path, payload)
  if mismatch := _class_mismatch(exported, facts):
    raise ValueError(f"{path} is damaged: {mismatch}; export it again")
  if "cuda" in exported.platforms and cuda_here():
    importlib.import_module("jax_triton")  # registers TRITON_CALL with XLA (importable with a CUDA jaxlib only)
  return Artifact(exported, facts)


def _deserialize(path: str, payload: bytes) -> jax.export.Exported:
  try:
    return jax.export.deserialize(bytearray(payload))
  except Exception as e:  # noqa: BLE001  (flatbuffers fails on foreign bytes in many ways: struct.error, IndexError…)
    kind = type(e).__qualname__ if type(e).__module__ == "builtins" else f"{type(e).__module__}.{type(e).__name__}"
    why = (str(e).splitlines() or [""])[0]
    raise ValueError(f"{path} is not an artifact or is damaged: its program cannot be read by this JAX "
                     f"({kind}{': ' + why if why else ''}); export it again") from None


def _class_mismatch(exported: jax.export.Exported, facts: dict) -> str | None:
  """Why `facts`' class names do not name the logits of `exported`, if they do not (facts without them: None)."""
  if "classes" not in facts:
    return None
  classes, outputs = facts["classes"], exported.out_avals
  logits = outputs[0].shape[1] if len(outputs) == 1 and outputs[0].ndim == 2 else None
  if isinstance(classes, list) and logits == len(classes):
    return None
  named = f"{len(classes)} classes" if isinstance(classes, list) else f"classes {classes!r}"
  gives = ", ".join(f"{a.dtype}{list(a.shape)}" for a in outputs)
  return f"its header names {named} for a program whose output is ({gives})"


def facts_of(described, input_kind: str = "uint8") -> dict:
  """What an inference artifact of a run says of itself: its classes, the statistics its uint8 input is normalised
  with, the stored size S its uint8 images have, the crop."""
  return dict(classes=list(described.classes), mean=np.asarray(described.statistics.mean).tolist(),
              std=np.asarray(described.statistics.std).tolist(), size=described.size,
              image_size=described.image_size, input=input_kind)


def describe(exported: jax.export.Exported) -> str:
  """One line: the function's name, platforms, devices, inputs and outputs."""
  shapes = lambda avals: ", ".join(f"{a.dtype}{list(a.shape)}" for a in avals)  # noqa: E731
  inputs = shapes(exported.in_avals) if len(exported.in_avals) <= 3 else f"{len(exported.in_avals)} arrays"
  outputs = shapes(exported.out_avals) if len(exported.out_avals) <= 3 else f"{len(exported.out_avals)} arrays"
  return (f"{exported.fun_name} for {', '.join(exported.platforms)} on {exported.nr_devices} device(s): "
          f"({inputs}) → ({outputs})")

