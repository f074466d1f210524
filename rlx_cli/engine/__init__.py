"""The engine: models (policy, reference, critic; LoRA or full), the built-in base model, the ``Rollout`` batch, and
every pass over them under ``trainer.micro_batch_tokens``, ``trainer.precision`` and ``trainer.strategy``
(micro-batches, log-probs, autocast, FSDP2 sharding, data parallelism over processes); glibc's allocator policy for
host memory.

May import: ``config``, ``components``. Knows nothing of tasks, samplers, loops or studies.
"""
