"""A run's start: the garbage collector is paused while it imports torch, transformers, peft and MLflow and builds
its models (``loops/run.py``, ``collector_paused``), and on again for the steps."""

from __future__ import annotations

import gc

import pytest
from conftest import SHORT


def test_a_run_connects_and_builds_with_the_collector_paused_and_trains_with_it_on(workdir, monkeypatch):
    from rlx_cli.loops import build, run
    from rlx_cli.loops.track import NullTracker

    seen = {}
    building, connecting = build.build, NullTracker.connect

    def build_seen(*args, **kwargs):
        seen["build"] = gc.isenabled()
        return building(*args, **kwargs)

    def connect_seen(self):
        seen["connect"] = gc.isenabled()
        return connecting(self)

    def steps_seen(cfg, parts, tracker, *args):
        seen["steps"] = gc.isenabled()
        return {"eval/accuracy": 0.0}

    monkeypatch.setattr(build, "build", build_seen)
    monkeypatch.setattr(NullTracker, "connect", connect_seen)
    monkeypatch.setattr("rlx_cli.loops.loop.train", steps_seen)
    assert gc.isenabled()
    run.train_command([*SHORT, "tracking=none", "trainer.output_dir=out"])
    assert seen == {"connect": False, "build": False, "steps": True} and gc.isenabled()


def test_the_collector_is_back_on_after_an_error_and_an_outer_pause_is_kept():
    from rlx_cli.loops.run import collector_paused

    with pytest.raises(RuntimeError), collector_paused():
        assert not gc.isenabled()
        raise RuntimeError("a build that failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()  # the caller's pause is the caller's to end
    finally:
        gc.enable()
