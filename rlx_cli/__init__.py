"""rlx: the command line over one run's flow, a layer per subpackage, each importing only the layers below it.

- ``cli``: the ``rlx`` commands; hands each to the layer that does it.
- ``studies/``: many runs: sweeps, ablations, study state, reports and their statistics.
- ``loops/``: one run: its entry point, build, the training loops, the update, checkpoints, MLflow tracking.
- ``sampling/``: prompts to scored responses: samplers (HF, vLLM), tasks, verifiers, rollout stages, a judge.
- ``engine/``: models and every pass over them under a token budget, precision and strategy (ddp, zero1, fsdp).
- ``config/``: compose, validate and list the Hydra config; the user's error type; the file locks every layer takes.

``components`` (the ingredients) sits below them all and imports nothing of ``rlx_cli``. The layers are a contract
in ``pyproject.toml`` (``[tool.importlinter]``) that ``lint-imports`` and the test suite check.
"""
