"""The batch every pass runs over: ``Rollout``, B sequences of prompt + response (samplers make it: ``sampling``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields

import torch


@dataclass
class Rollout:
    """One batch of B sequences: left-padded prompts of width P, right-padded responses of width T."""

    input_ids: torch.Tensor  # [B, P+T]
    attention_mask: torch.Tensor  # [B, P+T] 1 on real prompt and response tokens
    position_ids: torch.Tensor  # [B, P+T] counts real tokens only (left padding)
    responses: torch.Tensor  # [B, T]
    response_mask: torch.Tensor  # [B, T] float, 1 up to and including EOS
    texts: list[str]  # decoded responses, EOS and padding stripped
    sampler_logp: torch.Tensor | None = None  # [B, T] the sampler's own log-probs of the sampled tokens, 0 on padding
    # named [B, T] float tensors a rollout stage adds for the advantage (rlx_cli/sampling/credit.py: step rewards, SPO's
    # values), 0 on padding; the loop passes them to the components by name
    annotations: dict[str, torch.Tensor] = field(default_factory=dict)

    def to(self, device: torch.device) -> Rollout:
        """The same batch with its tensors on ``device``."""
        return Rollout(**{f.name: move(getattr(self, f.name), device) for f in fields(self)})

    @property
    def prompt_len(self) -> int:
        return self.input_ids.shape[1] - self.responses.shape[1]

    def tokens(self) -> float:
        """The number of real response tokens."""
        return float(self.response_mask.sum())

    @staticmethod
    def concat(parts: list[Rollout], pad_id: int) -> Rollout:
        """Stack batches of different widths: prompts re-padded on the left, responses on the right."""
        width_p = max(r.prompt_len for r in parts)
        width_t = max(r.responses.shape[1] for r in parts)

        def pad(x: torch.Tensor, left: int, right: int, value) -> torch.Tensor:
            return torch.nn.functional.pad(x, (left, right), value=value)

        prompts = torch.cat([pad(r.input_ids[:, : r.prompt_len], width_p - r.prompt_len, 0, pad_id) for r in parts])
        prompt_attn = torch.cat([pad(r.attention_mask[:, : r.prompt_len], width_p - r.prompt_len, 0, 0) for r in parts])
        responses = torch.cat([pad(r.responses, 0, width_t - r.responses.shape[1], pad_id) for r in parts])
        mask = torch.cat([pad(r.response_mask, 0, width_t - r.responses.shape[1], 0.0) for r in parts])
        attention = torch.cat([prompt_attn, mask.long()], dim=1)
        texts = [t for r in parts for t in r.texts]

        def padded(tensors: list[torch.Tensor]) -> torch.Tensor:  # [b, t] response-aligned tensors, 0 on padding
            return torch.cat([pad(x, 0, width_t - r.responses.shape[1], 0.0) for x, r in zip(tensors, parts)])

        logp = None
        if all(r.sampler_logp is not None for r in parts):
            logp = padded([r.sampler_logp for r in parts])
        names = set.intersection(*(set(r.annotations) for r in parts))
        annotations = {k: padded([r.annotations[k] for r in parts]) for k in sorted(names)}
        ids = torch.cat([prompts, responses], 1)
        return Rollout(ids, attention, position_ids(attention), responses, mask, texts, logp, annotations)

    def without_rows(self, dropped: torch.Tensor) -> Rollout:
        """The same batch with no response token left in the ``dropped`` rows ([B] bool): nothing of theirs
        reaches a loss, yet every row keeps its place."""
        mask = self.response_mask * (~dropped).to(self.response_mask.dtype).unsqueeze(1)
        return dataclasses.replace(self, response_mask=mask)

    def select(self, rows: torch.Tensor) -> Rollout:
        def pick(v):
            if v is None:
                return None
            if isinstance(v, dict):
                return {k: x[rows] for k, x in v.items()}
            return v[rows] if isinstance(v, torch.Tensor) else [v[i] for i in rows.tolist()]

        return Rollout(**{f.name: pick(getattr(self, f.name)) for f in fields(self)})


def move(value, device: torch.device):
    """A tensor (or a dict of them) to ``device``; anything else (texts, None) as it is."""
    if isinstance(value, dict):
        return {k: move(v, device) for k, v in value.items()}
    return value.to(device) if isinstance(value, torch.Tensor) else value


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions that skip left padding, as ``generate`` assigns them: [B, L] long."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)
