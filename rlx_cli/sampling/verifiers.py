"""Verifiers: a response and a reference answer -> a reward in [0, 1].

``exact`` compares the last line (after an optional ``####`` or ``answer:`` marker) with the answer;
``math`` uses math-verify (symbolic equality of the last expression; its own timeouts are off so it runs
in threads, and rlx's timeout applies); ``regex`` extracts the first group of ``task.answer_pattern``;
``module:function`` calls a user function ``fn(response: str, answer: str) -> float``.
An exception is reward 0 and is counted, never a crash. Verifiers that cannot hang run inline: ``exact`` (string
operations, linear in the response) and ``regex`` with a pattern free of nested repeats (polynomial in the
response, whose length ``rollout.max_new_tokens`` bounds). The others (``math``, a user's function, a regex that
could backtrack without end) run in reused daemon threads, one batch at a time, with ``task.verifier_timeout``
seconds for the batch: a time-out is reward 0 and is counted too (a hung call keeps its thread, never the exit).

A step verifier (``task.step_verifier``, process supervision) is a user function
``fn(response: str, answer: str, prompt: str) -> list[tuple[int, float]]``: one (end, reward) per step of the
response, in order, ``end`` the offset just past the step's last character (``re.Match.end()``); run the same way
(an exception, a time-out or another return type: no steps, counted).
"""

from __future__ import annotations

import importlib
import queue
import re
import threading
from collections.abc import Callable
from functools import partial

try:  # the regular expression parser: nested repeats are the patterns whose search can hang
    from re import _parser as sre_parse
except ImportError:  # Python 3.10
    import sre_parse

from rlx_cli.config.errors import UserError

Verifier = Callable[[str, str], float]


def exact(response: str, answer: str) -> float:
    last = response.strip().splitlines()[-1] if response.strip() else ""
    last = MARKER.split(last)[-1]
    return float(last.strip() == answer.strip())


MARKER = re.compile(r"####|answer:", flags=re.IGNORECASE)
exact.cannot_hang = True  # call_all runs it inline


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

    check.cannot_hang = not nested_repeat(sre_parse.parse(pattern))
    return check


def nested_repeat(parsed) -> bool:
    """Whether a parsed pattern has a repeat inside a repeat (``(a+)+``, ``(a|ab)*``, ``(\\d+,?)*``): the shape whose
    backtracking can take exponential time. Without one, a search is polynomial in the text's length."""
    for op, arg in parsed:
        inner = subpatterns(arg)
        if op in REPEATS and any(repeats(part) for part in inner) or any(nested_repeat(part) for part in inner):
            return True
    return False


def repeats(parsed) -> bool:
    """Whether a parsed pattern repeats or branches anywhere (an alternative inside a repeat backtracks too)."""
    return any(op in REPEATS or op == sre_parse.BRANCH or any(map(repeats, subpatterns(arg))) for op, arg in parsed)


def subpatterns(arg) -> list:
    """The parsed subpatterns inside one item's argument (a group's, a repeat's, a branch's, a look-around's)."""
    if isinstance(arg, sre_parse.SubPattern):
        return [arg]
    if isinstance(arg, (tuple, list)):
        return [part for item in arg for part in subpatterns(item)]
    return []


REPEATS = {sre_parse.MAX_REPEAT, sre_parse.MIN_REPEAT, getattr(sre_parse, "POSSESSIVE_REPEAT", sre_parse.MAX_REPEAT)}


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
    """``convert(fn(*args))`` for every args of ``calls`` -> (results, how many failed); an exception, or past the
    batch's one ``timeout``, gives ``default`` and counts as failed. Inline when ``fn`` cannot hang (its
    ``cannot_hang`` attribute), else all at once in ``POOL``'s daemon threads."""
    results, failed = [default] * len(calls), [True] * len(calls)

    def run(i: int, args: tuple) -> None:
        try:
            results[i] = convert(fn(*args))
            failed[i] = False
        except Exception:  # noqa: BLE001 - a user's verifier may raise anything; it costs the sample its reward
            results[i] = default

    if getattr(fn, "cannot_hang", False):
        for i, args in enumerate(calls):
            run(i, args)
        return results, failed.count(True)
    POOL.run([partial(run, i, args) for i, args in enumerate(calls)], timeout)
    done = [not bad for bad in failed]  # a snapshot: late finishers no longer count
    return [r if ok else default for r, ok in zip(results, done)], done.count(False)


class DaemonPool:
    """Daemon threads kept from batch to batch (starting a thread per answer cost 56 ms for 128 exact matches): each
    batch's calls run at once, in idle threads and new ones for the rest; a hung call keeps its thread, which never
    holds up the interpreter's exit, and later batches start another in its place."""

    def __init__(self):
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.idle = 0

    def run(self, jobs: list[Callable[[], None]], timeout: float) -> None:
        """Run ``jobs`` at once; return when all are done or ``timeout`` seconds have passed."""
        left, finished = len(jobs), threading.Event()

        def counted(job: Callable[[], None]) -> None:
            nonlocal left
            job()
            with self.lock:
                left -= 1
                if not left:
                    finished.set()

        with self.lock:
            started = max(0, len(jobs) - self.idle)
            self.idle -= len(jobs) - started
        for job in jobs:
            self.jobs.put(partial(counted, job))
        for _ in range(started):
            threading.Thread(target=self.work, daemon=True).start()
        if jobs:
            finished.wait(timeout)

    def work(self) -> None:
        while True:
            self.jobs.get()()
            with self.lock:
                self.idle += 1


POOL = DaemonPool()  # the verifiers' threads, for every task of this process
