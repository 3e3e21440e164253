"""The layer kinds a table may name, one module per family, each a `Kind` record (kind.py) of everything about it.
A kind of one's own is a `Kind` passed to `register_kind`, in a module imported before the table that names it
(a config file's, for example)."""

from alexnet_jax.network.layers import conv, dropout, fc, lrn, pool  # noqa: F401  each registers its kinds
from alexnet_jax.network.layers.kind import Kind, Step, kind_of, kinds, register_kind, steps

__all__ = ["Kind", "Step", "kind_of", "kinds", "register_kind", "steps"]
