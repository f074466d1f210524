"""scripts/reeval.py: K samples per held-out prompt, scored and averaged."""

from __future__ import annotations

import sys
from pathlib import Path

from conftest import save_tiny_llama

from rlx_cli.config.compose import compose
from rlx_cli.engine.batch import Rollout
from rlx_cli.sampling.rollout import HFSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import reeval  # noqa: E402


def test_sampled_accuracy_draws_k_samples_per_prompt_and_averages_their_scores(tmp_path, monkeypatch):
    model_dir = save_tiny_llama(tmp_path, layers=1, heads=1, head_dim=32, tie=True)
    cfg = compose(["task.eval_size=5", "rollout.max_new_tokens=4"])
    seen: list[str] = []

    def fake_generate(self, model, prompts, *, temperature, max_new_tokens):
        """Right on every third sample of the whole pass, wrong otherwise."""
        start = len(seen)
        seen.extend(prompts)
        texts = []
        for i, prompt in enumerate(prompts):
            answer = sum(int(t) for t in prompt.rstrip(":").split(","))
            texts.append(f"#{answer}" if (start + i) % 3 == 0 else "#-1")
        return Rollout(None, None, None, None, None, texts)

    monkeypatch.setattr(HFSampler, "generate", fake_generate)
    accuracy = reeval.sampled_accuracy(model_dir, cfg, samples=3, seed=0, batch=4)
    assert len(seen) == 15  # 5 prompts x 3 samples, in batches of at most 4
    assert seen[:3] == [seen[0]] * 3  # each prompt's samples side by side
    assert accuracy == 5 / 15
