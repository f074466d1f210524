"""Step 5a of a run, sampling and scoring: samplers (HF ``generate``, vLLM) that turn prompts into a ``Rollout``,
tasks (built-in sums, jsonl files, preference pairs), verifiers, rollout stages that add credit (process rewards,
SPO's continuations), and a judge model as the verifier.

May import: ``engine`` (the ``Rollout`` batch, models for the judge), ``config``, ``components``; never
``loops``, ``studies`` or ``cli``.
"""
