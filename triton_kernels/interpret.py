"""Running a kernel on the CPU under the Triton interpreter (TRITON_INTERPRET=1, set before triton is imported).

The interpreter expects torch tensors; `HostTensor` gives a numpy array the few methods it calls, and since host
and "device" are the same memory here, its copies are no-ops: the kernel writes straight into the array.
"""

import functools
import threading

import numpy as np

from triton_kernels.launch import Launch


class _Dtype:
  def __init__(self, name: str):
    self.name = name

  def __str__(self):
    return self.name


@functools.cache
def _dtype(name: str) -> _Dtype:
  # One object per dtype for the life of the process: Triton caches argument types by the dtype object's hash, its
  # address, which a freed object would hand on to another dtype.
  return _Dtype(name)


class HostTensor:
  def __init__(self, array: np.ndarray):
    if not array.flags.c_contiguous:
      raise ValueError("HostTensor needs a C-contiguous array")
    self.array = array
    self.dtype = _dtype(str(array.dtype))

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


# The interpreter swaps triton.language's functions for its own while a kernel runs: one kernel at a time, even when
# several simulated devices call back at once.
_ONE_AT_A_TIME = threading.Lock()


def run(launch: Launch, *arrays: np.ndarray) -> None:
  """launch.kernel[grid](*arrays, **constexprs) on host arrays; outputs are written in place."""
  with _ONE_AT_A_TIME:
    launch.kernel[launch.grid](*(HostTensor(a) for a in arrays), **launch.constexprs)
