"""Verifiers: a response and a reference answer -> a reward in [0, 1].

``exact`` compares the last line (after an optional ``####`` or ``answer:`` marker) with the answer;
``math`` uses math-verify (symbolic equality of the last expression; its own timeouts are off so it runs
in threads, and rlx's timeout applies); ``regex`` extracts the first group of ``task.answer_pattern``;
``module:function`` calls a user function ``fn(response: str, answer: str) -> float``.
Every call runs in a daemon thread with ``task.verifier_timeout`` seconds: an exception or a time-out is
reward 0 and is counted, never a crash.

A step verifier (``task.step_verifier``, process supervision) is a user function
``fn(response: str, answer: str, prompt: str) -> list[tuple[int, float]]``: one (end, reward) per step of the
response, in order, ``end`` the offset just past the step's last character (``re.Match.end()``); run the same way
(an exception, a time-out or another return type: no steps, counted).
"""

from __future__ import annotations

import importlib
import re
import threading
import time
from collections.abc import Callable

from rlx_cli.config.errors import UserError

Verifier = Callable[[str, str], float]


def exact(response: str, answer: str) -> float:
    last = response.strip().splitlines()[-1] if response.strip() else ""
    last = re.split(r"####|answer:", last, flags=re.IGNORECASE)[-1]
    return float(last.strip() == answer.strip())


def math(response: str, answer: str) -> float:
    from math_verify import parse, verify

    gold = parse(answer, parsing_timeout=None)
    predicted = parse(response, parsing_timeout=None)
    return float(verify(gold, predicted, timeout_seconds=None))


def regex(pattern: str) -> Verifier:
    compiled = re.compile(pattern)

    def check(response: str, answer: str) -> float:
        found = compiled.search(response)
        return float(found is not None and (found.group(1) if compiled.groups else found.group(0)).strip() == answer)

    return check


def load_verifier(name: str, answer_pattern: str | None) -> Verifier | None:
    """``exact`` | ``math`` | ``regex`` | ``module:function``; None for ``judge``, a model that scores whole batches
    (``rlx_cli/sampling/judge.py``, wrapped around the task by ``build``)."""
    if name == "judge":
        return None
    if name == "exact":
        return exact
    if name == "math":
        try:
            import math_verify  # noqa: F401
        except ImportError:
            raise UserError("task.verifier=math needs math-verify: pip install 'rlx[math]'") from None
        return math
    if name == "regex":
        if not answer_pattern:
            raise UserError("task.verifier=regex needs task.answer_pattern (a regex whose first group is the answer)")
        try:
            return regex(answer_pattern)
        except re.error as error:
            raise UserError(f"task.answer_pattern={answer_pattern!r} is not a valid regex: {error}") from None
    return import_function("task.verifier", name, "exact, math, regex, judge, module:function")


def import_function(key: str, name: str, valid: str = "module:function") -> Callable:
    """The function ``module:function`` that ``key`` names; one line naming the key if it cannot be had."""
    module, _, function = name.partition(":")
    if not module or not function:
        raise UserError(f"{key}={name} is not valid (valid: {valid})")
    try:
        return getattr(importlib.import_module(module), function)
    except (ImportError, AttributeError) as error:
        raise UserError(f"{key}={name} cannot be imported: {error}") from None


def score_all(verifier: Verifier, pairs: list[tuple[str, str]], timeout: float) -> tuple[list[float], int]:
    """Run ``verifier`` on every (response, answer) in parallel threads -> (rewards, how many failed)."""
    return call_all(verifier, pairs, timeout, float, 0.0)


def score_steps_all(step_verifier: Callable, triples: list[tuple[str, str, str]], timeout: float):
    """Run a step verifier on every (response, answer, prompt) -> (per response its [(end, reward), ...], failed)."""
    return call_all(step_verifier, triples, timeout, steps_of, [])


def steps_of(value) -> list[tuple[int, float]]:
    """A step verifier's return as [(end, reward), ...]; a TypeError or ValueError if it is not one."""
    steps = [(end, float(reward)) for end, reward in value]
    if not all(isinstance(end, int) and not isinstance(end, bool) for end, _ in steps):
        raise TypeError("step ends must be ints")
    return steps


def call_all(fn: Callable, calls: list[tuple], timeout: float, convert: Callable, default):
    """``convert(fn(*args))`` for every args of ``calls`` in parallel daemon threads, with one ``timeout`` for the
    batch -> (results, how many failed); an exception or a time-out gives ``default`` and counts as failed."""
    results = [default] * len(calls)
    failed = [True] * len(calls)

    def run(i: int, args: tuple) -> None:
        try:
            results[i] = convert(fn(*args))
            failed[i] = False
        except Exception:  # noqa: BLE001 - a user's verifier may raise anything; it costs the sample its reward
            results[i] = default

    threads = [threading.Thread(target=run, args=(i, args), daemon=True) for i, args in enumerate(calls)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout  # one budget for the whole batch
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))  # a hung verifier keeps its daemon thread
    done = [not bad for bad in failed]  # a snapshot: late finishers no longer count
    return [r if ok else default for r, ok in zip(results, done)], done.count(False)
