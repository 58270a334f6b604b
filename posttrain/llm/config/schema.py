"""The run config's sections: frozen dataclasses whose annotations are every key's type and limits.

A field's ``Annotated[T, Range(...)]`` / ``OneOf(...)`` is the one declaration of what the key accepts
(`posttrain.llm.typed` reads it); a section that a stage or a method owns is its own class, declared beside
what it configures (``rollout.replay``: `ReplayConfig`, ``model.lora``: `LoraConfig`, ``model.tiny``:
`TinyConfig`, ...). Upper limits stand where a value can exhaust memory or time (steps, sizes, counts).
Checks across sections are in `posttrain.llm.config.checks`; the option mappings (``data.options``,
``algorithm.options``, ``*_options``, ``optim.options``) are checked there against what they configure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from posttrain.errors import DomainError
from posttrain.estimators import ADVANTAGES, KL_ESTIMATORS, POLICY_LOSSES, REWARD_SHAPINGS, AggregationMode
from posttrain.llm.methods.catalog import METHODS
from posttrain.llm.methods.correction import RolloutCorrectionConfig
from posttrain.llm.methods.dpo import DpoConfig
from posttrain.llm.methods.pairs import PairDesignConfig
from posttrain.llm.policy import LoraConfig
from posttrain.llm.rollout.answer import AnswerSuffixConfig
from posttrain.llm.rollout.branching import BranchingConfig
from posttrain.llm.rollout.engine import SamplingConfig
from posttrain.llm.rollout.oracle import OracleConfig
from posttrain.llm.rollout.replay import ReplayConfig
from posttrain.llm.rollout.reward_fn import is_reward_spec
from posttrain.llm.rollout.tasks import TASKS
from posttrain.llm.rollout.text import PromptFormat
from posttrain.llm.tools.tiny import TinyConfig
from posttrain.llm.train.evaluate import eval_metric_names
from posttrain.llm.train.optim import SCHEDULERS, optimizer_names
from posttrain.llm.train.parallel import STRATEGIES
from posttrain.llm.typed import Checked, Matches, OneOf, Range

__all__ = [
    "AlgorithmConfig",
    "CheckpointConfig",
    "DataConfig",
    "DistributedConfig",
    "EngineName",
    "EsConfig",
    "LoggingConfig",
    "ModelConfig",
    "OptimConfig",
    "RolloutConfig",
    "RunConfig",
]

Count = Annotated[int, Range(1, 1 << 16)]
"""A count of prompts, samples or rows: 1 .. 65536."""
Steps = Annotated[int, Range(0, 10**8)]
"""A number of steps: 0 .. 10^8."""
Positive = Annotated[float, Range(0.0, None, low_open=True)]
NonNegative = Annotated[float, Range(0.0)]
Seed = Annotated[int, Range(0, 2**32 - 1)]
"""A seed: 0 .. 2^32 - 1 (the engine derives per-step seeds from it; they must stay below 2^63)."""
EngineName = Literal["hf", "vllm"]
"""``rollout.engine``: the keys of `posttrain.llm.run.ENGINE_FACTORIES`."""


@dataclass(frozen=True)
class ModelConfig(Checked):
    """The policy: ``path`` (local directory, hub id or registered name) or, when null, a tiny model built in
    ``out/tiny``."""

    path: str | None = None
    tiny: TinyConfig = field(default_factory=TinyConfig)
    """The tiny model's architecture (used when ``path`` is null)."""
    teacher: str | None = None
    teachers: dict[str, str] | None = None
    """Several teachers, domain name -> path or registered name, each routed to the rows of its domain (the
    task's `Problem.domain`: ``mixture`` task, ``dataset``'s ``domain`` column); exclusive with ``teacher``."""
    reference: str | None = None
    """The reference model of ``logp_ref`` and ``topk_logp_ref`` (KL terms; ExOPD's and OPD²'s teacher-base); null: the
    initial (SFT'd) policy."""
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    device: str = "cpu"
    chat_template: bool = False
    system_prompt: str | None = None
    """The system turn of chat-template prompts (null: the template's default, if any)."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass (less memory, one more forward)."""
    lora: LoraConfig | None = None
    """LoRA adapters through peft (`LoraConfig`); null: full fine-tuning."""

    def prompt_format(self) -> PromptFormat:
        """The run's one `PromptFormat` (``chat_template``, ``system_prompt``): every prompt encoder reads this one."""
        return PromptFormat(self.chat_template, self.system_prompt)

    def check(self) -> None:
        if self.teacher is not None and self.teachers is not None:
            raise DomainError("teachers: set model.teacher (one teacher) or model.teachers, not both")


@dataclass(frozen=True)
class DataConfig(Checked):
    """The task, prompts per step (G), and the supervised warm-up run before RL."""

    task: Annotated[str, OneOf(TASKS)] = "multiple"
    options: dict[str, Any] = field(default_factory=dict)
    """The task's options (its dataclass fields; checked at load against the task)."""
    reward: Annotated[str, Matches(is_reward_spec, "'package.module:function'")] | None = None
    """A reward function ``"module:function"`` with TRL's signature (replaces the task's own scoring); imported
    when the task is built for training, not when the config loads."""
    prompts_per_step: Count = 16
    eval_prompts: Annotated[int, Range(1, 1 << 20)] = 64
    sft_steps: Steps = 0
    sft_lr: Positive = 1e-2
    sft_batch_size: Count = 64


@dataclass(frozen=True)
class RolloutConfig(Checked):
    """Sampling: engine (``hf`` or ``vllm``), K samples per prompt, length and temperature; optional stages."""

    engine: EngineName = "hf"
    group_size: Annotated[int, Range(1, 1 << 12)] = 8
    max_new_tokens: Annotated[int, Range(1, 1 << 17)] = 8
    temperature: Annotated[float, Range(0.0, 100.0, low_open=True)] = 1.0
    top_p: Annotated[float, Range(0.0, 1.0, low_open=True)] = 1.0
    top_k: Annotated[int, Range(0, 1 << 20)] = 0
    """0: no cut."""
    vllm_gpu_memory_utilization: Annotated[float, Range(0.0, 1.0, low_open=True)] = 0.3
    enforce_eager: bool | None = None
    """vLLM only: run without CUDA graphs (None: eager on CPU, CUDA graphs on a GPU)."""
    compile_decode: bool = False
    """HF engine only: the decode step through ``torch.compile`` with a static KV cache (pays back
    its compile time only over many rollouts; see ``docs/performance.md``)."""
    replay: ReplayConfig | None = None
    branching: BranchingConfig | None = None
    answer_suffix: AnswerSuffixConfig | None = None
    """Append ``delimiter + gold answer + <eos>`` after every trace, scored in the training forward
    (`posttrain.llm.rollout.answer`); only for methods that read ``answer_mask``."""
    oracle: OracleConfig | None = None
    """Append the task's reference solution to every group as one more row (``synthetic``), scored by the same
    reward (`posttrain.llm.rollout.oracle`); ``group_size`` then counts it (``group_size - 1`` samples)."""
    staleness: Annotated[int, Range(0, 1024)] = 0
    """Train step ``t`` on rollouts generated by the policy of step ``max(0, t - staleness)``, deterministically
    (`posttrain.llm.train.pending`); with ``asynchronous``, the largest lag allowed (docs: off_policy.md)."""
    asynchronous: bool = False
    """Generate the next batches in a worker process while the trainer updates (`posttrain.llm.train.async_rollout`):
    a queue of at most ``staleness`` batches, weights synced after every step; HF engine only."""

    def sampling(self) -> SamplingConfig:
        """The run's one `SamplingConfig` (engine, fillers, training forward and hooks all read this one)."""
        return SamplingConfig(self.max_new_tokens, self.temperature, self.top_p, self.top_k)

    def check(self) -> None:
        b = self.branching
        if b is not None and not b.branches < self.group_size:
            raise DomainError(
                f"branching.branches: expected 1 <= b < rollout.group_size={self.group_size}, got {b.branches}"
            )
        if self.oracle is not None and (self.replay is not None or self.branching is not None):
            raise DomainError("oracle: not supported with rollout.replay or rollout.branching")
        if self.oracle is not None and self.answer_suffix is not None:
            raise DomainError("oracle: not supported with rollout.answer_suffix")
        if self.oracle is not None and self.group_size < 2:
            raise DomainError(
                f"group_size: rollout.oracle needs at least 1 sample + the oracle row, got {self.group_size}"
            )
        if self.answer_suffix is not None and (self.replay is not None or self.branching is not None):
            raise DomainError("answer_suffix: not supported with rollout.replay or rollout.branching")
        self._check_lag()

    def _check_lag(self) -> None:
        """What training at a lag (``staleness``, ``asynchronous``) supports."""
        if self.asynchronous and self.staleness < 1:
            raise DomainError("staleness: rollout.asynchronous needs a maximum staleness >= 1, got 0")
        if self.asynchronous and self.engine != "hf":
            raise DomainError(
                f"asynchronous: supports rollout.engine='hf' only (the worker process's vLLM engine is not "
                f"implemented), got {self.engine!r}"
            )
        if self.staleness and self.branching is not None:
            raise DomainError(
                "branching: not supported with rollout.staleness > 0 (its branches are sampled from the current "
                "policy, its prefixes from the policy of the batch: two lags in one group)"
            )


@dataclass(frozen=True)
class AlgorithmConfig(Checked):
    """A method preset by name; any field set here overrides the preset's choice."""

    method: Annotated[str, OneOf(METHODS)] = "grpo"
    advantage: Annotated[str, OneOf(ADVANTAGES)] | None = None
    loss: Annotated[str, OneOf(POLICY_LOSSES)] | None = None
    aggregation: Annotated[str, OneOf(tuple(m.value for m in AggregationMode))] | None = None
    advantage_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the advantage estimator (checked at load against its signature and its own checks)."""
    loss_options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the policy loss (checked at load against its signature and its own checks)."""
    kl: Annotated[str, OneOf(KL_ESTIMATORS)] | None = None
    kl_coef: Annotated[float, Range(0.0, 1e6)] = 0.0
    entropy_coef: Annotated[float, Range(0.0, 1e6)] = 0.0
    options: dict[str, Any] = field(default_factory=dict)
    """Options of a method built by a factory (its typed options class, e.g. ``gflowrl``: ``beta``, ``max_up``, ...)."""
    topk: Annotated[int, Range(1, 1 << 20)] = 1024
    """K of the student's top-K support filled for methods that need ``[B, T, K]`` log-probs (``opd2``);
    clamped to the vocabulary size (K = V is the exact expectation)."""
    rollout_correction: RolloutCorrectionConfig | None = None
    """Importance weights between the trainer's recomputed and the engine's log-probs, on the policy loss of any
    method (`posttrain.llm.methods.correction`; docs: off_policy.md); null: none (the loss's ratio is to the
    engine's log-probs)."""

    def check(self) -> None:
        if (self.kl is None) != (self.kl_coef == 0.0):
            raise DomainError(
                f"kl: set both algorithm.kl and algorithm.kl_coef (a KL name and a coefficient > 0) or neither; "
                f"got {self.kl!r}, {self.kl_coef!r}"
            )


@dataclass(frozen=True)
class OptimConfig(Checked):
    """Optimisation: ``steps`` rollout batches, ``updates_per_batch`` optimizer steps on each."""

    steps: Annotated[int, Range(1, 10**8)] = 40
    name: Annotated[str, OneOf(optimizer_names)] = "AdamW"
    lr: Annotated[float, Range(0.0, 1e3, low_open=True)] = 1e-5
    options: dict[str, Any] = field(default_factory=dict)
    """Keyword options of the optimizer (checked at load against its class)."""
    updates_per_batch: Annotated[int, Range(1, 1 << 12)] = 1
    micro_batch_size: Annotated[int, Range(1, 1 << 20)] | None = None
    """Rows per forward in the update: a multiple of ``rollout.group_size`` (null: the whole batch)."""
    max_grad_norm: Positive | None = 1.0
    scheduler: Annotated[str, OneOf(SCHEDULERS)] = "constant"
    warmup_steps: Steps = 0


@dataclass(frozen=True)
class CheckpointConfig(Checked):
    """Checkpoint every ``every`` steps (0: only at the end), keeping the ``keep`` latest."""

    every: Steps = 0
    keep: Annotated[int, Range(1, 10**4)] = 2


@dataclass(frozen=True)
class LoggingConfig(Checked):
    """``metrics.jsonl`` always; a rich progress bar, TensorBoard and W&B when asked (and installed)."""

    progress: bool = True
    tensorboard: bool = False
    wandb_project: str | None = None
    eval_every: Steps = 0
    eval_samples: Annotated[int, Range(1, 1 << 12)] = 8
    eval_metric: Annotated[str, OneOf(eval_metric_names)] = "reward_mean"
    """The validation score a schedule reads (a key of `evaluate`'s output)."""


@dataclass(frozen=True)
class DistributedConfig(Checked):
    """Data parallel under ``torch.distributed`` (ignored in a single process): ``ddp`` or ``fsdp`` (FSDP2)."""

    strategy: Annotated[str, OneOf(STRATEGIES)] = "ddp"


@dataclass(frozen=True)
class EsConfig(Checked):
    """``posttrain es``: evolution strategies in place (Qiu et al. 2025, arXiv:2509.24372).

    ES starts from the SFT'd model, or after the ``optim.steps`` RL steps of the config when
    ``after_rl`` (GRPO -> ES, Ba et al. 2026). Fitness: mean reward of one greedy response on each of
    ``prompts_per_step`` prompts (default ``data.prompts_per_step``), at most ``rollout.max_new_tokens``,
    ``micro_batch`` prompts per ``generate`` call (all at once if None; fewer = less activation memory).
    """

    population: Count = 32
    sigma: Positive = 1e-3
    lr: Positive = 5e-4
    steps: Steps = 500
    antithetic: bool = False
    """Mirrored pairs of perturbations (the population must be even)."""
    shaping: Annotated[str, OneOf(REWARD_SHAPINGS)] = "zscore"
    lockstep: bool = True
    prompts_per_step: Count | None = None
    after_rl: bool = False
    micro_batch: Count | None = None

    def check(self) -> None:
        if self.antithetic and self.population % 2:
            raise DomainError(f"population: antithetic pairs need an even population, got {self.population}")


@dataclass(frozen=True)
class RunConfig(Checked):
    """Everything a run needs; ``seed`` fixes model init, data, sampling and SFT."""

    seed: Seed = 0
    """Fixes the tiny model's initialisation, the data stream, the sampling seeds and the SFT warm-up."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    es: EsConfig = field(default_factory=EsConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    pairs: PairDesignConfig = field(default_factory=PairDesignConfig)
    """``posttrain pairs design``: the DPO pair design (`PairDesignConfig`)."""
    dpo: DpoConfig = field(default_factory=DpoConfig)
    """``posttrain dpo``: DPO on a pairs file (`DpoConfig`)."""
