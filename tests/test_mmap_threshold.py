"""glibc's mmap threshold: 8 MiB for the run (``loops/run.py``), 1 MiB while sampling (``Engine.sampling``)."""

from __future__ import annotations

import sys

import pytest
from torch import nn

from rlx_cli.engine import allocator
from rlx_cli.engine.allocator import M_MMAP_THRESHOLD, MAPPED_BYTES, SAMPLED_BYTES
from rlx_cli.engine.engine import Engine
from rlx_cli.engine.models import Models


def test_sampling_maps_from_1_mib_and_leaves_8_mib_behind_even_after_an_error(monkeypatch):
    calls = []
    monkeypatch.setattr(allocator, "glibc_mallopt", lambda: lambda *call: calls.append(call))
    policy = nn.Linear(2, 2)
    sampling = Engine(Models(policy, None, None, None, None, None), micro_batch_tokens=64, strategy="ddp").sampling
    with sampling():
        assert calls == [(M_MMAP_THRESHOLD, SAMPLED_BYTES)] and not policy.training
    with pytest.raises(KeyError), sampling():
        raise KeyError
    assert calls == [(M_MMAP_THRESHOLD, SAMPLED_BYTES), (M_MMAP_THRESHOLD, MAPPED_BYTES)] * 2
    assert policy.training


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_takes_the_threshold():
    assert allocator.glibc_mallopt()(M_MMAP_THRESHOLD, MAPPED_BYTES) == 1  # mallopt's 1: done
