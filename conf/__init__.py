"""Hydra config groups of rlx, shipped inside the wheel as ``rlx_cli.conf``."""
