"""One run, steps 3-6: ``rlx train``'s entry point, build, value pretraining, the training loops (rl, rft, dpo,
online_dpo), the update over minibatches and micro-batches, the non-finite guard, checkpoints, MLflow tracking,
signals and progress bars.

May import: the layers below it (``sampling``, ``engine``, ``config``) and ``components``; never ``studies``
or ``cli``.
"""
