"""The trainable policy as TRL users configure it: LoRA adapters through ``peft`` and gradient checkpointing.

- ``model.lora`` (`LoraConfig`): `prepare_policy` wraps the loaded model with
  ``peft.get_peft_model`` so only the low-rank adapters ``B A`` (scaled by ``alpha / r``) of the target
  linear layers train; the base weights stay frozen.
- ``model.gradient_checkpointing``: activations of each decoder layer are recomputed in the backward
  pass (``use_reentrant=False``, so frozen inputs and LoRA both get gradients); ``config.use_cache`` is
  switched off for training (the training forward passes ``use_cache=False`` itself).

Checkpoints (`save_policy`, `load_policy_weights`): a LoRA policy's ``model/`` holds the
adapter (``adapter_config.json`` + ``adapter_model.safetensors``, ``save: adapter``) or the merged full
weights, loadable with plain ``from_pretrained``, with the adapter in ``model/adapter/`` for resuming
(``save: merged``). ``AutoModelForCausalLM.from_pretrained`` on an adapter directory loads the base model
named in its ``adapter_config.json`` (the run's ``initial/``, an absolute path) and the adapter on top.
"""

from __future__ import annotations

import copy
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from posttrain.errors import DomainError
from posttrain.llm.typed import Checked, Range

__all__ = ["LORA_SAVES", "LoraConfig", "is_peft", "load_policy_weights", "prepare_policy", "save_policy"]

LoraSave = Literal["adapter", "merged"]
LORA_SAVES: tuple[str, ...] = typing.get_args(LoraSave)
"""``model.lora.save``: what a checkpoint's ``model/`` holds."""

ADAPTER_FILE = "adapter_model.safetensors"


@dataclass(frozen=True)
class LoraConfig(Checked):
    """LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"): ``W + (alpha/r) B A``.

    ``target_modules``: comma-separated module names (``"q_proj,v_proj"``) or ``"all-linear"``.
    ``save``: ``adapter`` (checkpoints hold the adapter) or ``merged`` (full weights with ``B A`` folded in).
    """

    r: Annotated[int, Range(1, 1 << 14)] = 8
    alpha: Annotated[int, Range(0, 1 << 20, low_open=True)] = 16
    dropout: Annotated[float, Range(0.0, 1.0, high_open=True)] = 0.0
    target_modules: str = "q_proj,k_proj,v_proj,o_proj"
    save: LoraSave = "adapter"

    def check(self) -> None:
        """Refuse values peft would reject later (or silently misuse)."""
        if not self.modules():
            raise DomainError(f"target_modules: expected module names or 'all-linear', got {self.target_modules!r}")

    def modules(self) -> list[str] | str:
        if self.target_modules.strip() == "all-linear":
            return "all-linear"
        return [m.strip() for m in self.target_modules.split(",") if m.strip()]


def is_peft(model: Any) -> bool:
    """Whether ``model`` (bare or DDP-wrapped) is a ``peft`` model."""
    return hasattr(getattr(model, "module", model), "peft_config")


def prepare_policy(
    model: Any, *, lora: LoraConfig | None, gradient_checkpointing: bool, base_path: str | Path | None = None
) -> Any:
    """The policy to train: ``model`` with gradient checkpointing and/or LoRA adapters (peft) applied.

    ``base_path``: the directory ``model`` was loaded from, recorded (absolute) in the adapter config so an
    adapter checkpoint loads with ``from_pretrained`` anywhere. Raises ``DomainError`` naming
    ``model.lora.target_modules`` when no layer of the model matches.
    """
    if gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.24's name
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora is None:
        return model
    import peft

    lora.check()
    peft_cfg = peft.LoraConfig(
        r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.modules(), task_type="CAUSAL_LM"
    )
    try:
        with warnings.catch_warnings():  # peft 0.21 reads transformers' deprecated `is_gradient_checkpointing`
            warnings.filterwarnings(
                "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            wrapped: Any = peft.get_peft_model(model, peft_cfg)
    except ValueError as exc:  # "Target modules {...} not found in the base model"
        raise DomainError(f"model.lora.target_modules: {exc}") from exc
    if gradient_checkpointing:  # frozen embeddings: the checkpointed layers' inputs must still require grad
        wrapped.enable_input_require_grads()
    if base_path is not None:
        wrapped.peft_config["default"].base_model_name_or_path = str(Path(base_path).resolve())
    wrapped.posttrain_lora_save = lora.save
    return wrapped


def save_policy(model: Any, path: str | Path, *, weights: dict[str, Any] | None = None) -> None:
    """``model.save_pretrained(path)``; a LoRA policy saves its adapter, or (``save: merged``) the merged full
    weights in ``path`` and the adapter in ``path/adapter``."""
    path = Path(path)
    if not is_peft(model):
        model.save_pretrained(path, state_dict=weights)
        return
    if getattr(model, "posttrain_lora_save", "adapter") == "merged":
        merged = copy.deepcopy(model).merge_and_unload()
        merged.save_pretrained(path)
        model.save_pretrained(path / "adapter")
    else:
        model.save_pretrained(path)


def load_policy_weights(policy: Any, path: str | Path, weights: dict[str, Any]) -> Any:
    """Load a checkpoint's weights (its ``model/`` directory's safetensors) into ``policy``; returns the
    ``load_state_dict`` result. A LoRA policy loads its adapter (``path/adapter`` when saved merged); its
    frozen base weights are not in the checkpoint, so only unexpected keys count as a mismatch."""
    if not is_peft(policy):
        return policy.load_state_dict(weights, strict=False)
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    path = Path(path)
    adapter = path / "adapter" / ADAPTER_FILE
    adapter = adapter if adapter.is_file() else path / ADAPTER_FILE
    if not adapter.is_file():
        raise ValueError(f"checkpoint {path} has no LoRA adapter ({ADAPTER_FILE}) for this LoRA policy")
    result: Any = set_peft_model_state_dict(policy, load_file(str(adapter)))
    return type(result)(missing_keys=[], unexpected_keys=list(result.unexpected_keys))
