"""The configs, each a get_config(): `python scripts/train.py --config configs/NAME.py`, or in Python
alexnet_jax.get_config("NAME") (installed as the package alexnet_jax.configs)."""
