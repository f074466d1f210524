"""The sampler process of ``rollout.overlap`` as a process: the weights it reads on a GPU."""

from __future__ import annotations

from types import SimpleNamespace

import torch


def test_loading_the_sampling_copy_waits_for_the_gpu(monkeypatch):
    """On CUDA ``copy_`` only queues the copies: ``load`` returns once they are done, so the sampler process (which
    reads the copy through CUDA IPC) never sees half-written weights. Here a CPU copy with the GPU's calls stubbed."""
    from rlx_cli.engine import behaviour

    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    on_gpu = SimpleNamespace(parameters=lambda: iter([SimpleNamespace(device=torch.device("cuda", 1))]))
    behaviour.settle(on_gpu)
    assert synced == [torch.device("cuda", 1)]
    behaviour.settle(torch.nn.Linear(2, 2))  # the CPU: copy_ is done when it returns
    assert synced == [torch.device("cuda", 1)]

    policy = torch.nn.Linear(2, 2)
    copy = behaviour.Behaviour(policy, lag=1, dtype="fp32")
    settled = []
    monkeypatch.setattr(behaviour, "settle", lambda model: settled.append(model.weight.detach().clone()))
    with torch.no_grad():
        policy.weight.fill_(3.0)
    copy.keep(policy)
    copy.keep(policy)
    assert copy.load(ahead=1) is copy.model
    assert len(settled) == 1 and torch.equal(settled[0], torch.full((2, 2), 3.0))  # settled after the last copy
