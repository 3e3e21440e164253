"""Running a kernel on the CPU under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported).

The interpreter expects torch tensors; `HostTensor` gives a numpy array the few methods it calls, and since host
and "device" are the same memory here, its copies are no-ops: the kernel writes straight into the array.
"""

import numpy as np

from triton_kernels.launch import Launch


class _Dtype:
  def __init__(self, name: str):
    self.name = name

  def __str__(self):
    return self.name


class HostTensor:
  def __init__(self, array: np.ndarray):
    if not (array.flags.c_contiguous and array.flags.writeable):
      raise ValueError("HostTensor needs a C-contiguous, writeable array")
    self.array = array
    self.dtype = _Dtype(str(array.dtype))

  def data_ptr(self):
    return self.array.ctypes.data

  def untyped_storage(self):
    return self

  def cpu(self):
    return self

  def copy_(self, other):
    return self

  def new_empty(self, *args, **kwargs):
    return HostTensor(self.array)

  def set_(self, *args):
    return self

  def storage_offset(self):
    return 0

  def size(self):
    return self.array.shape

  def stride(self):
    return tuple(s // self.array.itemsize for s in self.array.strides)


def run(kernel, launch: Launch, *arrays: np.ndarray) -> None:
  """kernel[grid](*arrays, **constexprs) on host arrays; outputs are written in place."""
  kernel[launch.grid](*(HostTensor(a) for a in arrays), **launch.constexprs)
