"""Where verifiers run: inline when they cannot hang (exact, a regex without nested repeats), else in reused daemon
threads under the batch's time-out, a hung call's thread replaced."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from rlx_cli.sampling import verifiers
from rlx_cli.sampling.verifiers import call_all, exact, regex, score_all


def test_exact_and_a_regex_without_nested_repeats_cannot_hang():
    assert exact.cannot_hang and regex(r"answer: (-?\d+)").cannot_hang and regex(r"\\boxed\{(.*?)\}").cannot_hang
    for pattern in (r"(a+)+b", r"(a|ab)*c", r"(?:x\d+)*", r"(\d+,?)+$", r"(?=(a+))+"):
        assert not regex(pattern).cannot_hang, pattern


# one item of each shape nested_repeat walks: pattern -> (op, its arg's leading fields, its subpatterns)
SHAPES = {
    "a+": ("MAX_REPEAT", (1, "MAXREPEAT"), 1),
    "a*?": ("MIN_REPEAT", (0, "MAXREPEAT"), 1),
    "(a)": ("SUBPATTERN", (1, 0, 0), 1),
    "ab|cd": ("BRANCH", (None,), 2),
    "(?=a)": ("ASSERT", (1,), 1),
    "(?<!a)": ("ASSERT_NOT", (-1,), 1),
    **({"a*+": ("POSSESSIVE_REPEAT", (0, "MAXREPEAT"), 1), "(?>a)": ("ATOMIC_GROUP", (), 1)}
       if sys.version_info >= (3, 11) else {}),
}  # fmt: skip
REPEATING = {"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"}


@pytest.mark.parametrize("pattern", list(SHAPES))
def test_the_private_regex_parser_reads_as_the_nested_repeat_check_expects(pattern):
    """verifiers.py reads Python's private regex parser (``re._parser``; ``sre_parse`` before 3.11), which may change
    with any Python: ``parse`` gives (op, arg) items, and a repeat's, a group's, a branch's or a look-around's arg is
    its leading fields, then its subpatterns, which ``subpatterns`` finds. A parser that changes any of this fails
    here, not as a regex verifier that hangs a run."""
    parser, (op, head, parts) = verifiers.sre_parse, SHAPES[pattern]
    if sys.version_info >= (3, 11):
        import re

        assert parser is re._parser
    [(got, arg)] = list(parser.parse(pattern))
    assert got is getattr(parser, op)
    inner = verifiers.subpatterns(arg)
    assert len(inner) == parts and all(isinstance(p, parser.SubPattern) for p in inner)
    fields = () if isinstance(arg, parser.SubPattern) else arg[: -1 if op != "BRANCH" else 1]
    assert fields == tuple(getattr(parser, f) if isinstance(f, str) else f for f in head)
    assert (op in REPEATING) is (got in verifiers.REPEATS)
    assert verifiers.repeats(parser.parse(pattern)) is (op in REPEATING | {"BRANCH"})


def test_a_verifier_that_cannot_hang_runs_inline_and_others_in_reused_threads():
    where = []

    def record(response: str, answer: str) -> float:
        where.append(threading.get_ident())
        return float(response == answer)

    record.cannot_hang = True
    rewards, errors = score_all(record, [("1", "1"), ("2", "3")], timeout=1.0)
    assert rewards == [1.0, 0.0] and errors == 0 and set(where) == {threading.get_ident()}

    del record.cannot_hang
    where.clear()
    before = threading.active_count()
    for _ in range(3):
        rewards, errors = score_all(record, [("1", "1")] * 8, timeout=5.0)
        assert rewards == [1.0] * 8 and errors == 0
    assert threading.get_ident() not in where
    assert threading.active_count() - before <= 8  # the second and third batches started no thread of their own


def test_a_hung_call_keeps_its_thread_and_the_next_batch_still_runs():
    release = threading.Event()

    def stuck(response: str, answer: str) -> float:
        if response == "hang":
            release.wait(30)
        return 1.0

    started = time.monotonic()
    rewards, errors = call_all(stuck, [("hang", ""), ("ok", "")], 0.3, float, 0.0)
    assert rewards == [0.0, 1.0] and errors == 1 and time.monotonic() - started < 5
    rewards, errors = call_all(stuck, [("ok", "")] * 4, 5.0, float, 0.0)
    assert rewards == [1.0] * 4 and errors == 0
    release.set()


@pytest.mark.parametrize("inline", [True, False])
def test_an_exception_is_reward_zero_inline_or_not(inline):
    def boom(response: str, answer: str) -> float:
        raise ValueError("broken")

    if inline:
        boom.cannot_hang = True
    assert score_all(boom, [("a", "b")] * 3, timeout=1.0) == ([0.0] * 3, 3)
