"""Many runs: ``rlx sweep`` / ``rlx ablate`` (points, launchers, locks, resumable study state), ``rlx status``, and
``rlx report`` (reading runs from MLflow, tables, statistics with Holm, fits, plots).

May import: the layers below it (``loops``, ``sampling``, ``engine``, ``config``) and ``components``; never
``cli``. Today it uses ``loops`` (``track``'s store URI and git sha) and ``config``.
"""
