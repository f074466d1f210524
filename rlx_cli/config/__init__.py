"""Step 1-2 of a run, compose and validate: the Hydra config from ``conf/`` + presets + overlays + overrides, checked
against the registry and the keys' ranges before anything is built; ``rlx ls``; ``UserError``, the one-line error
every layer raises for users; the choice lists of keys that the layers above interpret (precision, strategy, loop);
``locks``, the file locks every layer takes (who is alive, one process at a time), here at the bottom so that all can.

May import: ``components`` only (the bottom layer of ``rlx_cli``).
"""
