"""The host cache on a CUDA GPU (`pytest -m gpu tests/test_gpu_cache.py`): there its batch buffers are mapped for the
GPU's DMA, each put crossing whole, and used again, each once its batches have crossed to the device; every batch
placed, all put before the first is finished, is still the decoded one when all are read at the end.
Without a CUDA device the module is skipped (on CPU devices the buffers are not used again: test_cache.py)."""

import jax
import numpy as np
import pytest
from test_cache import BATCH, SIZE, SLOTS, N, dataset  # noqa: F401  (dataset: the fixture)

from alexnet_jax.data import cache, host_memory, train_batches
from alexnet_jax.data.device_batches import BatchLayout
from alexnet_jax.network import sharding

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a CUDA GPU")]


@pytest.mark.parametrize("group", [1, 3], ids=["a batch a put", "three batches a put"])
def test_host_cache_buffers_are_not_rewritten_before_their_batch_has_crossed(dataset, group):  # noqa: F811
  rows = BatchLayout(sharding.make_mesh(1, 1), ("data",))
  rule = cache.Schedule(SLOTS, N, BATCH, rows.blocks, 0)
  cached = train_batches(dataset, BATCH, rows=rows.process_rows(BATCH), cached=rule)
  plain = train_batches(dataset, BATCH)
  put = cache.HostCachedPut(rows, SIZE, 16, rule)
  steps = group * (4 * host_memory.BUFFERS + 2)  # the fill, then every buffer used again several times over
  # every put made before the first is finished
  finishes = [put.put([cached[s][0] for s in range(step, step + group)]) for step in range(0, steps, group)]
  placed = [batch for finish in finishes for batch, _ in finish()]  # all held until the end
  assert put._buffers.mapped and not put._join  # each put's buffer mapped for the DMA, crossing whole, not in parts
  for step, got in enumerate(placed):
    want, _ = plain[step]
    for k in want:
      np.testing.assert_array_equal(np.asarray(got[k]), want[k], err_msg=f"{k} of step {step}")
  put.close()
