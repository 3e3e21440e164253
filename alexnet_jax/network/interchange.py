"""Weights to and from the PyTorch/Caffe grouped-AlexNet layout: a flat dict of numpy arrays.

Keys are `<layer>.weight` and `<layer>.bias` for every conv and fc layer of the table. Conv weights are OIHW
(F, C_in/groups, KH, KW), fc weights (F_out, F_in) with y = x @ W.T + b. Tower t owns output block t (tower a's
filters first); a conv that reads its own tower is PyTorch's `groups=towers`, and the first fc reads the last
maps flattened per image in (C, H, W) order. The grouping changes which inputs a filter sees, not how its weights
are laid out, so every split='out' layer converts the same way whatever its `inputs`.
"""

import jax.numpy as jnp
import numpy as np

from alexnet_jax.network.layers import kind_of
from alexnet_jax.network.shapes import layer_shapes
from alexnet_jax.network.table import Layer, Table


def _kernel_to_torch(kernel: np.ndarray, layer: Layer) -> np.ndarray:
  if layer.split == "sum":  # (T, F_in/T, F_out): tower t holds the rows of input block t
    return kernel.reshape(-1, kernel.shape[-1]).T
  if kernel.ndim == 5:  # (T, C_in, KH, KW, F/T) → (F, C_in, KH, KW)
    return kernel.transpose(0, 4, 1, 2, 3).reshape(-1, *kernel.shape[1:4])
  return kernel.transpose(0, 2, 1).reshape(-1, kernel.shape[1])  # (T, F_in, F/T) → (F, F_in)


def _kernel_from_torch(weight: np.ndarray, shape: tuple[int, ...], layer: Layer) -> np.ndarray:
  if layer.split == "sum":
    return weight.T.reshape(shape)
  towers, *middle, out = shape
  order = (0, *range(2, len(shape)), 1)  # filters back to the last axis
  return weight.reshape(towers, out, *middle).transpose(order)


def _torch_shapes(table: Table, shapes) -> dict[str, tuple[int, ...]]:
  out = {}
  for layer in table.weighted():
    towers, *middle, last = shapes[layer.name]["kernel"]
    kernel = (last, towers * middle[0]) if layer.split == "sum" else (towers * last, *middle)
    out[f"{layer.name}.weight"] = kernel
    out[f"{layer.name}.bias"] = (kernel[0],)
  return out


def param_shapes(table: Table, image_size: int | tuple[int, int] = 224):
  """The flax parameter shapes {layer: {'kernel': shape, 'bias': shape}} of `Network(table)` at this input (the
  input size fixes the first fc layer's fan-in)."""
  return layer_shapes(table, image_size).params


def torch_shapes(table: Table, image_size: int | tuple[int, int] = 224):
  """The {key: shape} that `to_torch` gives and `from_torch` expects."""
  return _torch_shapes(table, param_shapes(table, image_size))


def _float32(key: str, value) -> np.ndarray:
  a = np.asarray(value)  # also gathers a sharded jax array onto the host
  if not jnp.issubdtype(a.dtype, jnp.floating):
    raise ValueError(f"{key}: expected a floating-point array, got dtype {a.dtype}")
  with np.errstate(over="ignore"):
    a = a.astype(np.float32, copy=False)
  if not np.isfinite(a).all():
    raise ValueError(f"{key}: holds {np.count_nonzero(~np.isfinite(a)):,} values that are not finite in float32")
  return a


def _check(problems: list[str]):
  if problems:
    raise ValueError("weights do not match the layer table:\n  " + "\n  ".join(problems))


def to_torch(params, table: Table) -> dict[str, np.ndarray]:
  """Flax parameters (host or sharded, any float dtype) → {'conv1.weight': (96, 3, 11, 11) float32, …}."""
  weighted = table.weighted()
  names = {layer.name for layer in weighted}
  problems = [f"{name}: parameters of a layer the table does not have" for name in params if name not in names]
  arrays = {}
  for layer in weighted:
    p = params.get(layer.name)
    if p is None or set(p) != {"kernel", "bias"}:
      problems.append(f"{layer.name}: expected parameters 'kernel' and 'bias', got {sorted(p or ())}")
      continue
    try:
      kernel, bias = _float32(f"{layer.name}/kernel", p["kernel"]), _float32(f"{layer.name}/bias", p["bias"])
    except ValueError as e:
      problems.append(str(e))
      continue
    ndim = 3 if kind_of(layer).flat else 5  # (towers, C_in, KH, KW, F) or (towers, F_in, F)
    t, out = kernel.shape[0], kernel.shape[-1]
    want_bias = (out,) if layer.split == "sum" else (t, out)
    if kernel.ndim != ndim or bias.shape != want_bias:
      problems.append(f"{layer.name}: expected a {ndim}-d kernel and bias {want_bias}, got kernel {kernel.shape} "
                      f"and bias {bias.shape}")
      continue
    arrays[layer.name] = kernel, bias
  _check(problems)
  state = {}
  for layer in weighted:
    kernel, bias = arrays[layer.name]
    # Fresh, writable, C-ordered copies: torch.from_numpy takes them as they are and they share nothing with params.
    state[f"{layer.name}.weight"] = np.array(_kernel_to_torch(kernel, layer), order="C")
    state[f"{layer.name}.bias"] = np.array(bias.reshape(-1), order="C")
  return state


def read(path: str) -> dict[str, np.ndarray]:
  """{'conv1.weight': …} from a weights file: .npz (numpy.savez of to_torch's dict) or a PyTorch state dict
  (.pt/.pth; needs PyTorch, which this package does not)."""
  try:
    if path.endswith(".npz"):
      with np.load(path, allow_pickle=False) as f:
        return {k: f[k] for k in f.files}
    if path.endswith((".pt", ".pth")):
      try:
        import torch  # noqa: PLC0415
      except ModuleNotFoundError:
        raise ValueError(f"{path}: reading a PyTorch file needs PyTorch; or save its state dict as .npz "
                         "(numpy.savez(path, **{k: v.numpy() for k, v in state.items()}))") from None
      state = torch.load(path, map_location="cpu", weights_only=True)
      return {k: v.float().numpy() for k, v in state.get("state_dict", state).items()}
  except (OSError, ValueError, KeyError) as e:
    if isinstance(e, ValueError) and str(e).startswith(path):
      raise
    raise ValueError(f"cannot read weights from {path}: {e}") from None
  raise ValueError(f"{path}: a weights file must be .npz, .pt or .pth")


def start_from(path: str, table: Table, image_size: int, fresh) -> dict:
  """The parameters of `table` from the weights file at `path` (read), checked shaped and finite; a last layer of
  another number of classes is made anew: `fresh`'s (fine-tuning on other classes)."""
  state = read(path)
  last = tuple(f"{table.weighted()[-1].name}.{leaf}" for leaf in ("weight", "bias"))
  expected = torch_shapes(table, image_size)
  if any(k in state and np.shape(state[k])[:1] != expected[k][:1] for k in last):
    state = {k: v for k, v in state.items() if k not in last} | {k: to_torch(fresh, table)[k] for k in last}
  return from_torch(state, table, image_size=image_size)


def from_torch(state: dict, table: Table, *,
               image_size: int | tuple[int, int] = 224) -> dict[str, dict[str, np.ndarray]]:
  """{'conv1.weight': …} (numpy arrays, torch tensors' .numpy(), any float dtype) → flax parameters, float32 numpy.

  The table (with its towers) and `image_size` are those of the Network the parameters are for: they fix the
  expected shapes, and every missing or unexpected key and every wrong shape is reported in one ValueError.
  """
  shapes = param_shapes(table, image_size)
  expected = _torch_shapes(table, shapes)
  problems = [f"{key}: unexpected key" for key in state if key not in expected]
  arrays = {}
  for key, shape in expected.items():
    if key not in state:
      problems.append(f"{key}: missing, expected shape {shape}")
      continue
    try:
      a = _float32(key, state[key])
    except ValueError as e:
      problems.append(str(e))
      continue
    if a.shape != shape:
      problems.append(f"{key}: expected shape {shape}, got {a.shape}")
    arrays[key] = a
  _check(problems)
  params = {}
  for layer in table.weighted():
    kernel_shape, bias_shape = shapes[layer.name]["kernel"], shapes[layer.name]["bias"]
    params[layer.name] = {
        "kernel": np.array(_kernel_from_torch(arrays[f"{layer.name}.weight"], kernel_shape, layer), order="C"),
        "bias": np.array(arrays[f"{layer.name}.bias"].reshape(bias_shape), order="C"),
    }
  return params
