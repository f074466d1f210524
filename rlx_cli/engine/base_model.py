"""The built-in base model: a tiny Llama with a character tokenizer, supervised-trained once and cached.

The cache key is a hash of everything that makes the checkpoint (architecture, SFT settings, task range), so
changing any of them trains a new base; ``$RLX_HOME`` (default ``~/.cache/rlx``) holds them as
``base/tiny-<hash>/`` in ``save_pretrained`` format (safetensors), written to a temp dir and renamed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rlx_cli.config import locks

CHARS = "0123456789+=,#:"
SPECIAL = ["<pad>", "<s>", "</s>"]
VOCAB_SIZE = 20  # 18 symbols, rounded up


def rlx_home() -> Path:
    return Path(os.environ.get("RLX_HOME", Path.home() / ".cache" / "rlx"))


def char_tokenizer(chars: str = CHARS):
    """A ``PreTrainedTokenizerFast`` with one token per character of ``chars`` (newlines included) and BOS prepended;
    a character outside ``chars`` reads as padding."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL + list(chars))}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<pad>",
        clean_up_tokenization_spaces=False,
    )


TASK_RECIPE = ("name", "min_terms", "max_terms", "dataset", "config", "template", "answer_format")


def cache_key(model_cfg: DictConfig, task_cfg: DictConfig, task=None) -> str:
    """A hash of the architecture, the SFT settings, the task's keys of ``TASK_RECIPE`` it has and what the task
    itself adds (``task.recipe()``: the generator's version)."""
    settings = OmegaConf.to_container(task_cfg, resolve=True)
    recipe = {
        "arch": OmegaConf.to_container(model_cfg.arch),
        "sft": OmegaConf.to_container(model_cfg.sft),
        "task": {k: settings[k] for k in TASK_RECIPE if k in settings},
    }
    if hasattr(task, "recipe"):
        recipe["generator"] = task.recipe()
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]


def ensure_base_model(model_cfg: DictConfig, task_cfg: DictConfig, task, progress, device="cpu") -> Path:
    """The cached base model's directory, training it first if it is not there yet."""
    target = rlx_home() / "base" / f"tiny-{cache_key(model_cfg, task_cfg, task)}"
    if (target / "config.json").exists():
        return target
    with locks.holding(target.parent / f"{target.name}.lock"):  # parallel sweep workers: one trains, the others wait
        if not (target / "config.json").exists():
            _train_and_save(model_cfg, task_cfg, task, target, progress, device)
    return target


def char_llama_config(arch: dict, *, tie: bool = True, max_positions: int = 128, chars: str = CHARS):
    """A ``LlamaConfig`` with ``arch``'s fields (hidden size, layers, ...) for the character tokenizer of ``chars``:
    its vocabulary size and special token ids. ``arch`` may set ``max_position_embeddings`` (default
    ``max_positions``)."""
    from transformers import LlamaConfig

    tokenizer = char_tokenizer(chars)
    return LlamaConfig(
        **{"max_position_embeddings": max_positions, **arch},
        vocab_size=max(VOCAB_SIZE, len(SPECIAL) + len(chars)),
        tie_word_embeddings=tie,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _train_and_save(model_cfg, task_cfg, task, target: Path, progress, device) -> None:
    from transformers import LlamaForCausalLM

    sft = model_cfg.sft
    chars = task.chars() if hasattr(task, "chars") else CHARS  # task=gym: the generator's alphabet
    tokenizer = char_tokenizer(chars)
    torch.manual_seed(sft.seed)
    config = char_llama_config(OmegaConf.to_container(model_cfg.arch), chars=chars)
    model = LlamaForCausalLM(config).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=sft.lr, betas=(0.9, 0.98), weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _warmup_cosine(s, sft.warmup_steps, sft.steps))
    rng = random.Random(sft.seed)
    start = time.perf_counter()
    with progress.task("building the base model (first run only)", total=sft.steps) as advance:
        for _ in range(sft.steps):
            examples = task.sft_examples(sft.batch_size, rng=rng, **defects(task, sft))
            optimizer.zero_grad(set_to_none=True)
            loss = sft_backward(model, tokenizer, examples, sft.get("length_buckets", 1))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            advance(loss=loss)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "rlx_sft.json").write_text(
        json.dumps({"final_loss": loss, "seconds": time.perf_counter() - start, **OmegaConf.to_container(sft)})
    )
    try:
        tmp.rename(target)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)


def defects(task, sft: DictConfig) -> dict[str, float]:
    """The SFT data's flaws that ``task.sft_examples`` takes and ``model.sft`` sets (sums: ``carry_drop``,
    ``direct_frac``, ``direct_right``; gym: ``defect``): a key absent from the config keeps the task's default."""
    takes = inspect.signature(task.sft_examples).parameters
    return {k: sft[k] for k in takes if k not in ("n", "rng") and k in sft}


def _warmup_cosine(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def sft_backward(model, tokenizer, examples: list[tuple[str, str]], buckets: int = 1) -> float:
    """Backpropagates ``sft_loss`` over ``examples`` -> the loss. ``buckets`` > 1 (``model.sft.length_buckets``): the
    examples sorted by length and cut into that many micro-batches, each loss weighted by its share of the response
    tokens, so the gradient is the whole batch's token mean (up to rounding) with far less padding where lengths vary
    widely (task=varied_sums' answers of 8 to 166 tokens: 4 buckets halve a step's time)."""
    if buckets <= 1:
        loss = sft_loss(model, tokenizer, examples)
        loss.backward()
        return loss.item()
    ordered = sorted(examples, key=lambda e: len(e[0]) + len(e[1]))
    parts = [ordered[i * len(ordered) // buckets : (i + 1) * len(ordered) // buckets] for i in range(buckets)]
    parts = [part for part in parts if part]
    counts = [response_tokens(tokenizer, part) for part in parts]
    total = 0.0
    for part, count in zip(parts, counts):
        loss = sft_loss(model, tokenizer, part) * (count / sum(counts))
        loss.backward()
        total += loss.item()
    return total


def response_tokens(tokenizer, examples: list[tuple[str, str]]) -> int:
    """The tokens ``sft_loss`` averages over: each response's, + EOS."""
    return sum(len(ids) + 1 for ids in tokenizer([r for _, r in examples], add_special_tokens=False)["input_ids"])


def sft_loss(model, tokenizer, examples: list[tuple[str, str]]) -> torch.Tensor:
    """Next-token cross-entropy on response tokens (+ EOS) only; right-padded batch."""
    prompts = tokenizer([p for p, _ in examples])["input_ids"]
    responses = tokenizer([r for _, r in examples], add_special_tokens=False)["input_ids"]
    rows = [p + r + [tokenizer.eos_token_id] for p, r in zip(prompts, responses)]
    width = max(map(len, rows))
    input_ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (p, row) in enumerate(zip(prompts, rows)):
        input_ids[i, : len(row)] = torch.tensor(row)
        labels[i, len(p) : len(row)] = torch.tensor(row[len(p) :])
    # right padding under a causal mask cannot affect earlier tokens, so no attention mask is needed
    return model(input_ids=input_ids.to(model.device), labels=labels.to(model.device)).loss
