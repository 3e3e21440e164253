"""alexnet_jax: cuda-convnet's two-GPU AlexNet rebuilt with JAX, shard_map and Triton kernels in CHWN layout.

From Python (api.py): `alexnet_jax.get_config(name)`, `alexnet_jax.train(config, workdir)`,
`alexnet_jax.load(workdir)` → a trained run with `.classes`, `.predict(images)`, `.top(images)`, `.evaluate()`.
They are imported on first use: `import alexnet_jax` (which every config file does) loads no JAX.
"""

API = ("get_config", "config_names", "train", "load", "Model")


def __getattr__(name):
  if name in API:
    from alexnet_jax import api  # noqa: PLC0415

    return getattr(api, name)
  raise AttributeError(f"module 'alexnet_jax' has no attribute {name!r}")


def __dir__():
  return sorted((*globals(), *API))
