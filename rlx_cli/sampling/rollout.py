"""Rollouts: prompts -> sampled responses as one padded batch, with HF ``generate`` (vLLM: ``vllm_rollout``)."""

from __future__ import annotations

import torch

from rlx_cli.engine.batch import Rollout, position_ids


def response_mask(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    """[B, T] float mask: 1 on every token up to and including the first EOS, 0 after it."""
    is_eos = (responses == eos_id).long()
    return ((is_eos.cumsum(1) - is_eos) == 0).float()


class HFSampler:
    """Samples with ``model.generate``, at most ``rows`` sequences per call (``rollout.generate_rows``: the KV
    cache grows with them); ``temperature=0`` is greedy."""

    def __init__(self, tokenizer, *, top_p: float = 1.0, chat_template: bool = False, rows: int = 256):
        self.tokenizer = tokenizer
        self.top_p = top_p
        self.rows = rows
        self.chat_template = chat_template and getattr(tokenizer, "chat_template", None) is not None

    def render(self, prompt: str) -> str:
        """The text the model sees: the prompt inside the tokenizer's chat template when asked for and present."""
        if not self.chat_template:
            return prompt
        messages = [{"role": "user", "content": prompt}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def encode(self, prompts: list[str], prefixes: list[list[int]] | None = None):
        """Rendered, tokenized, left-padded prompts: ``input_ids`` and ``attention_mask`` [B, P]; with ``prefixes``
        each prompt's tokens followed by its prefix's token ids (the start of a response to continue).

        Each distinct prompt is rendered and tokenized once, and padded here: the loop passes a group's prompt
        ``group_size`` times (the default's 128 prompts: 0.7 ms against 2.3 ms for the tokenizer's own padding)."""
        distinct = list(dict.fromkeys(prompts))
        texts = [self.render(p) for p in distinct]
        special = not self.chat_template  # a chat template writes its own special tokens
        tokens = dict(zip(distinct, self.tokenizer(texts, add_special_tokens=special)["input_ids"]))
        rows = [list(tokens[p]) for p in prompts]
        if prefixes is not None:
            rows = [row + list(prefix) for row, prefix in zip(rows, prefixes)]
        return left_padded(rows, self.tokenizer.pad_token_id)

    def generate(self, model, prompts: list[str], *, temperature: float, max_new_tokens: int, prefixes=None) -> Rollout:
        """Responses to ``prompts``, ``rows`` at a time, as one batch. ``prefixes``: for each prompt the token ids
        of a response's beginning, which the sampled tokens continue (SPO's continuations); the Rollout's prompts
        then end with them and its responses are the continuations."""
        cut = lambda items, i: None if items is None else items[i : i + self.rows]  # noqa: E731
        chunks = [
            self.generate_chunk(model, cut(prompts, i), temperature, max_new_tokens, cut(prefixes, i))
            for i in range(0, len(prompts), self.rows)
        ]
        return chunks[0] if len(chunks) == 1 else Rollout.concat(chunks, self.tokenizer.pad_token_id)

    @torch.no_grad()
    def generate_chunk(self, model, prompts: list[str], temperature: float, max_new_tokens: int, prefixes=None):
        """One ``generate`` call; sampled (temperature > 0) answers carry the log-prob of each token under the
        distribution it was drawn from (``Rollout.sampler_logp``), greedy ones none."""
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

        tok = self.tokenizer
        enc = self.encode(prompts, prefixes).to(model.device)
        recorder, sampling = None, {}
        if temperature > 0:  # the warpers generate would add, then the recorder, which sees their result
            recorder = SampledLogp()
            nucleus = [TopPLogitsWarper(self.top_p)] if self.top_p < 1 else []
            processors = LogitsProcessorList([TemperatureLogitsWarper(temperature), *nucleus, recorder])
            sampling = dict(temperature=1.0, top_p=1.0, top_k=0, logits_processor=processors)  # none of its own
        was_training = model.training
        model.eval()
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            **sampling,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            synced_gpus=False,  # every process samples on its own (FSDP gathers the weights first: sharding.py)
        )
        model.train(was_training)
        responses = out[:, enc["input_ids"].shape[1] :]
        return assemble(tok, enc, responses, None if recorder is None else recorder.result(responses))

    def sync(self, model) -> None:
        """``generate`` samples from the policy itself: there is nothing to copy."""


class SampledLogp:
    """A logits processor that records log p of each sampled token under the scores it is handed last in
    ``generate``'s list (after temperature and top-p): at each step the previous step's token is known."""

    def __init__(self):
        self.logps: list[torch.Tensor] = []  # [B] per step
        self.last: torch.Tensor | None = None  # [B, V] log-softmax of the latest scores

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.last is not None:
            self.logps.append(self.last.gather(1, input_ids[:, -1:]).squeeze(1))
        self.last = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def result(self, responses: torch.Tensor) -> torch.Tensor:
        """[B, T] float32 log-probs of ``responses`` [B, T] (the tokens generate returned)."""
        steps = self.logps + ([] if self.last is None else [self.last.gather(1, responses[:, -1:]).squeeze(1)])
        if not steps:
            return torch.zeros(responses.shape, dtype=torch.float32, device=responses.device)
        return torch.stack(steps[: responses.shape[1]], dim=1)


def left_padded(rows: list[list[int]], pad_id: int):
    """Token id lists as ``input_ids`` and ``attention_mask`` [B, P] (a ``BatchEncoding``), padded on the left to
    the longest."""
    from transformers import BatchEncoding

    width = max(map(len, rows))
    ids = [[pad_id] * (width - len(row)) + row for row in rows]
    mask = [[0] * (width - len(row)) + [1] * len(row) for row in rows]
    return BatchEncoding({"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)})


def assemble(tokenizer, enc, responses: torch.Tensor, sampler_logp: torch.Tensor | None = None) -> Rollout:
    """The Rollout of left-padded prompts ``enc`` and sampled ``responses`` [B, T]: masked after the first EOS."""
    mask = response_mask(responses, tokenizer.eos_token_id)
    responses = torch.where(mask.bool(), responses, tokenizer.pad_token_id)
    attention = torch.cat([enc["attention_mask"], mask.long()], dim=1)
    texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
    if sampler_logp is not None:  # after an EOS a top-p sampler's log-probs may be -inf: 0 there
        sampler_logp = torch.where(mask.bool(), sampler_logp.float(), 0.0)
    input_ids = torch.cat([enc["input_ids"], responses], dim=1)
    return Rollout(input_ids, attention, position_ids(attention), responses, mask, texts, sampler_logp)
