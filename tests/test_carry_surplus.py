"""DAPO's accounting: ``train/draws`` and ``train/groups_kept`` each step, and ``rollout.carry_surplus``: informative
groups beyond a step's need wait for the next step, which spends them first; none is used twice; they survive a
checkpoint and a SIGKILL."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
from conftest import SHORT, rlx, rlx_start
from omegaconf import OmegaConf

from rlx_cli.engine.batch import Rollout, position_ids
from rlx_cli.loops import checkpoint
from rlx_cli.loops.groups import Groups, problems_of, sample_groups
from rlx_cli.sampling.tasks import Problem

PROMPTS, SIZE = 4, 2


class OriginTask:
    """Prompts that name their origin ``step-draw-i``; groups 0, 1 and 2 of a draw are informative (one right answer
    of two), group 3 is not."""

    reward_errors = 0

    def train_problems(self, n: int, *, seed: int, step: int, draw: int = 0) -> list[Problem]:
        return [Problem(f"{step}-{draw}-{i}", "right") for i in range(n)]

    def score_batch(self, texts: list[str], problems: list[Problem]) -> list[float]:
        return [float(t.endswith("/0") and int(t.split("/")[0].split("-")[2]) < 3) for t in texts]


class EchoSampler:
    """Answers ``prompt/j``, the j-th of the prompt's group: two response tokens each."""

    def generate(self, model, prompts: list[str], *, temperature: float, max_new_tokens: int) -> Rollout:
        texts = [f"{p}/{j % SIZE}" for j, p in enumerate(prompts)]
        ids = torch.arange(len(prompts) * 3).view(-1, 3)
        mask = torch.ones_like(ids)
        logp = torch.zeros(len(prompts), 2)
        return Rollout(ids, mask, position_ids(mask), ids[:, 1:], torch.ones(len(prompts), 2), texts, logp)


def fake_parts():
    models = SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0), device=torch.device("cpu"), policy=None)
    advantage = SimpleNamespace(takes=lambda name: False)
    engine = SimpleNamespace(sampling=nullcontext)
    return SimpleNamespace(task=OriginTask(), sampler=EchoSampler(), models=models, engine=engine,
                           components={"advantage": advantage})  # fmt: skip


def config(carry: bool):
    rollout = dict(prompts_per_step=PROMPTS, group_size=SIZE, dynamic_sampling=True, max_draws=4, temperature=1.0,
                   max_new_tokens=2, carry_surplus=carry)  # fmt: skip
    return OmegaConf.create({"seed": 0, "rollout": rollout, "trainer": {"placebo_reward": False}})


def origins(batch: Rollout) -> list[str]:
    """Each group's origin ``step-draw-i``, read from its answers (which must agree within the group)."""
    names = [t.split("/")[0] for t in batch.texts]
    groups = [names[i : i + SIZE] for i in range(0, len(names), SIZE)]
    assert all(len(set(g)) == 1 for g in groups)
    return [g[0] for g in groups]


def test_the_surplus_waits_for_the_next_step_which_spends_it_first_and_no_group_is_used_twice():
    cfg, parts, carried = config(True), fake_parts(), Groups()
    steps = [sample_groups(cfg, parts, step, None, carried) for step in (1, 2, 3)]
    used = [origins(batch) for batch, *_ in steps]
    assert used[0] == ["1-0-0", "1-0-1", "1-0-2", "1-1-0"]  # 3 informative of draw 0, the first needed of draw 1
    assert used[1] == ["1-1-1", "1-1-2", "2-0-0", "2-0-1"]  # step 1's surplus first, then a fresh draw
    assert used[2] == ["2-0-2", "3-0-0", "3-0-1", "3-0-2"]
    every = [o for step in used for o in step]
    assert len(every) == len(set(every))
    assert carried.origins == [] and len(carried) == 0  # step 3's one draw had no surplus left over
    metrics = [m for *_, m in steps]
    assert [m["train/draws"] for m in metrics] == [2.0, 1.0, 1.0]
    assert [m["train/groups_kept"] for m in metrics] == [6.0, 3.0, 3.0]  # drawn and kept: in the batch or carried
    scores = steps[1][1].view(-1, SIZE)
    assert scores[:, 0].tolist() == [1.0] * 4 and scores[:, 1].tolist() == [0.0] * 4  # each row kept its score


def test_without_carrying_the_surplus_is_dropped_and_every_step_draws_afresh():
    cfg, parts = config(False), fake_parts()
    steps = [sample_groups(cfg, parts, step, None, None) for step in (1, 2)]
    assert [origins(batch) for batch, *_ in steps] == [["1-0-0", "1-0-1", "1-0-2", "1-1-0"],
                                                       ["2-0-0", "2-0-1", "2-0-2", "2-1-0"]]  # fmt: skip
    assert [m["train/groups_kept"] for *_, m in steps] == [4.0, 4.0]
    assert [m["train/groups"] for *_, m in steps] == [4.0, 4.0]


def test_carried_groups_round_trip_through_a_checkpoint_as_safetensors_and_json(tmp_path):
    from dataclasses import asdict

    from safetensors.torch import load_file, save_file

    carried = Groups()
    sample_groups(config(True), fake_parts(), 1, None, carried)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = checkpoint.pack(asdict(checkpoint.TrainState(step=1, carried=carried)), "", tensors)
    save_file(tensors, str(tmp_path / "state.safetensors"))
    (tmp_path / "state.json").write_text(json.dumps(skeleton))
    skeleton = json.loads((tmp_path / "state.json").read_text())
    state = checkpoint.unpack(skeleton, load_file(tmp_path / "state.safetensors"))
    back = Groups.restored(state["carried"])
    assert back.origins == carried.origins == [(1, 1, 1), (1, 1, 2)]
    assert back.batch.texts == carried.batch.texts and torch.equal(back.scores, carried.scores)
    assert torch.equal(back.batch.input_ids, carried.batch.input_ids)
    assert problems_of(config(True), OriginTask(), back.origins, {})[1].prompt == "1-1-2"  # the problem drawn again


# DAPO on the built-in default, a checkpoint every step: the run is killed at the first one that holds carried groups
DAPO = [*(o for o in SHORT if not o.startswith("trainer.steps=")), "algo=dapo", "rollout.carry_surplus=true", "seed=1",
        "trainer.steps=8", "trainer.ckpt_every=1", "rollout.group_size=4", "tracking=none"]  # fmt: skip


def carried_at(folder) -> bool:
    """Whether checkpoint ``folder`` holds carried groups (False if the run has just deleted it, an old one)."""
    try:
        saved = json.loads((folder / "state.json").read_text())
    except FileNotFoundError:
        return False
    return bool(dict(dict(saved["dict"])["carried"]["dict"])["origins"])


@pytest.mark.slow
def test_sigkill_then_resume_keeps_the_carried_groups(workdir):
    straight = rlx_start("train", *DAPO, "trainer.output_dir=straight", cwd=workdir, stdout=subprocess.DEVNULL)
    proc = rlx_start("train", *DAPO, "trainer.output_dir=killed", cwd=workdir, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)  # fmt: skip
    deadline, killed_at = time.monotonic() + 300, None
    while killed_at is None and proc.poll() is None and time.monotonic() < deadline:
        latest = checkpoint.latest(workdir / "killed")
        if latest is not None and latest.name != "step-000008" and carried_at(latest):
            proc.send_signal(signal.SIGSTOP)  # no checkpoint after this one: the kill lands on it
            latest = checkpoint.latest(workdir / "killed")
            if latest.name != "step-000008" and carried_at(latest):
                killed_at = latest
                proc.send_signal(signal.SIGKILL)
            else:
                proc.send_signal(signal.SIGCONT)
        time.sleep(0.02)
    assert killed_at is not None, "no checkpoint of the run held carried groups: the test shows nothing"
    assert proc.wait() == -signal.SIGKILL
    resumed = rlx("train", *DAPO, "trainer.output_dir=killed", "trainer.resume=true", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {killed_at.relative_to(workdir)}" in resumed.stderr
    _, err = straight.communicate(timeout=600)
    assert straight.returncode == 0, err
    expected, got = (json.loads((workdir / d / "metrics.json").read_text()) for d in ("straight", "killed"))
    assert {k: v for k, v in got.items() if not k.startswith("perf/")} == {
        k: v for k, v in expected.items() if not k.startswith("perf/")
    }
