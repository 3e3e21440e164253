"""The placement plan of each strategy, read without compiling: where each layer's input, weights and output lie, and
what its collectives move (tests/test_comm_report.py compiles each strategy once to check XLA does the same)."""

import pytest

from alexnet_jax.network import placement
from alexnet_jax.network.placement import GATHER, GATHER_SLICES, OWN_SLICES, OWN_TOWERS, SLICES, TOWERS, WHOLE
from alexnet_jax.network.table import Layer, Table, alexnet, with_places, with_strategy

PAPER = alexnet()
WEIGHTED = ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8")


def rows(plan, *fields):
  return {p.layer.name: tuple(getattr(p, f) for f in fields) for p in plan.layers}


def test_the_paper_split_reads_across_devices_at_conv3_and_the_fc_layers_only():
  plan = placement.plan(PAPER, "tower", model=2)
  reads = {name: read for name, (read,) in rows(plan, "read").items() if read}
  assert reads == {"conv3": (GATHER,), "fc6": (GATHER,), "fc7": (GATHER,)}
  assert [p.layer.name for p in plan.layers if p.reduce] == ["fc8"]  # each tower's partial logits summed
  assert {p.layer.name: p.weights for p in plan.layers if p.weights} == dict.fromkeys(WEIGHTED, TOWERS)
  assert rows(plan, "towers", "blocks")["conv2"] == (1, 1)  # a tower and its own block of conv1's maps
  assert not any(p.gather_batch or p.split_batch for p in plan.layers) and not plan.gather_output
  assert plan.input_axes == plan.output_axes == ("data",)  # both towers read the whole batch of their data shard
  assert plan["fc8"].split_weights == dict(kernel=True, bias=False)  # one bias for the summed layer


def test_on_one_device_every_tower_runs_side_by_side_and_nothing_moves():
  plan = placement.plan(PAPER, "tower", model=1)
  assert all(not p.read and not p.reduce and p.weights in ("", WHOLE) for p in plan.layers)
  blocks = rows(plan, "blocks", "towers")
  assert blocks["conv1"] == (1, 2) and blocks["conv2"] == (2, 2) and blocks["conv3"] == (1, 2)  # grouped, or not
  assert plan.traffic(224, 128) == {}


def test_data_parallelism_keeps_every_weight_whole_and_splits_the_batch_over_every_device():
  plan = placement.plan(PAPER, "data", model=2, data=2)
  assert all(not p.read and not p.reduce and not p.gather_batch and p.split_batch for p in plan.layers)
  assert plan.input_axes == plan.output_axes == ("data", "model")
  traffic = plan.traffic(224, 128)
  assert set(traffic) == {(name, "all-reduce", 4) for name in WEIGHTED}
  assert traffic["conv1", "all-reduce", 4] == (2 * 3 * 11 * 11 * 48 + 96) * 4  # its gradient, float32


def test_the_hybrid_gathers_the_batch_once_and_splits_the_fc_layers_into_slices():
  plan = placement.plan(PAPER, "hybrid", model=2)
  assert [p.layer.name for p in plan.layers if p.gather_batch] == ["fc6"]
  assert [p.layer.name for p in plan.layers if p.split_batch] == ["conv1", "lrn1", "pool1", "conv2", "lrn2",
                                                                   "pool2", "conv3", "conv4", "conv5", "pool5"]
  got = rows(plan, "read", "input", "weights", "output")
  assert got["fc6"] == ((), WHOLE, SLICES, SLICES)
  assert got["drop6"] == ((), SLICES, "", SLICES)
  assert got["fc7"] == ((GATHER_SLICES,), WHOLE, SLICES, SLICES)  # every tower's slices, reordered tower by tower
  assert got["fc8"] == ((), SLICES, SLICES, WHOLE) and plan["fc8"].reduce
  assert plan.input_axes == ("data", "model") and plan.output_axes == ("data",)


def test_the_bytes_of_the_paper_split_are_its_maps_and_logits():
  plan = placement.plan(PAPER, "tower", model=2)
  for dtype_bytes in (4, 2):
    traffic = plan.traffic(224, 128, dtype_bytes)
    pool2, pool5, fc6 = 256 * 13 * 13 * 128, 256 * 6 * 6 * 128, 4096 * 128
    assert traffic == {
        ("conv3", "all-gather", 2): pool2 * dtype_bytes, ("conv3", "reduce-scatter", 2): pool2 * dtype_bytes,
        ("fc6", "all-gather", 2): pool5 * dtype_bytes, ("fc6", "reduce-scatter", 2): pool5 * dtype_bytes,
        ("fc7", "all-gather", 2): fc6 * dtype_bytes, ("fc7", "reduce-scatter", 2): fc6 * dtype_bytes,
        ("fc8", "all-reduce", 2): 1000 * 128 * 4}  # partial logits in float32 whatever the dtype
  # Over data shards too: each pair moves its shard's rows, and every gradient is summed over the pairs.
  traffic = placement.plan(PAPER, "tower", model=2, data=4).traffic(224, 128)
  assert traffic["conv3", "all-gather", 2] == 256 * 13 * 13 * 32 * 4
  assert traffic["conv3", "all-reduce", 4] == (2 * 256 * 3 * 3 * 192 + 384) * 4 // 2  # a device's tower


def test_layers_placed_one_by_one():
  # Convolutions data-parallel, fc6 and fc7 on towers, fc8 on slices: after fc7's towers, fc8 gathers them whole
  # and takes its own slice of each.
  table = with_places(PAPER, dict.fromkeys(("conv1", "conv2", "conv3", "conv4", "conv5"), "data") |
                      {"fc6": "tower", "fc7": "tower", "fc8": "model"})
  assert [layer.place for layer in table.layers] == ["data"] * 10 + ["tower"] * 4 + ["model"]
  plan = placement.plan(table, "table", model=2)
  got = rows(plan, "read", "input", "weights", "output")
  assert plan["fc6"].gather_batch and got["fc6"] == ((), WHOLE, TOWERS, TOWERS)
  assert got["fc8"] == ((GATHER, OWN_SLICES), SLICES, SLICES, WHOLE)
  # A tower layer after data layers cuts its own towers' maps out of the whole ones.
  table = with_places(PAPER, {"conv1": "data", "conv2": "tower"} | dict.fromkeys(PAPER.names[6:], "tower"))
  plan = placement.plan(table, "table", model=2)
  assert plan["conv2"].gather_batch and plan["conv2"].read == (OWN_TOWERS,)


def test_the_last_layer_split_into_towers_is_gathered_whole():
  table = Table((Layer("conv1", "conv", filters=8, size=3), Layer("fc", "fc", filters=10, inputs="all")))
  plan = placement.plan(table, "tower", model=2)
  # fc gathers conv1's towers' 3×3 maps as its input, and its logits at the end
  assert plan.gather_output and plan.traffic(5, 4)[("fc", "all-gather", 2)] == (8 * 3 * 3 + 10) * 4 * 4


def test_plans_that_cannot_be_placed_are_refused():
  with pytest.raises(ValueError, match="2 towers cannot be spread evenly over a model axis of 4"):
    placement.plan(PAPER, "tower", model=4)
  with pytest.raises(ValueError, match="unknown strategy 'pipeline'"):
    placement.plan(PAPER, "pipeline")
  with pytest.raises(ValueError, match="no layer conv9 in the table"):
    with_places(PAPER, {"conv9": "data"})
  with pytest.raises(ValueError, match="place='data' layers must come first"):
    with_places(PAPER, {"fc6": "data"})
  assert with_strategy(PAPER, "hybrid") == with_places(PAPER, dict.fromkeys(PAPER.names[:10], "data") |
                                                         dict.fromkeys(PAPER.names[10:], "model"))
