"""The run config: `schema` (the sections, every key's type and limits), `load` (strict, bounded YAML and
``--set`` overrides), `targets` (what each option mapping configures) and `checks` (checks across sections;
`load_run` builds the method once). The table of what a method needs from a batch is
`posttrain.llm.methods.needs`; the validator that reads the annotations is `posttrain.llm.typed`."""

from posttrain.llm.config.checks import (
    RunPlan,
    algorithm_of,
    config_from_dict,
    config_to_dict,
    load_config,
    load_run,
    plan_from_dict,
    plan_run,
)
from posttrain.llm.config.load import apply_overrides, read_yaml, read_yaml_mapping
from posttrain.llm.config.schema import (
    AlgorithmConfig,
    CheckpointConfig,
    DataConfig,
    DistributedConfig,
    EsConfig,
    LoggingConfig,
    ModelConfig,
    OptimConfig,
    RolloutConfig,
    RunConfig,
)

__all__ = [
    "AlgorithmConfig", "CheckpointConfig", "DataConfig", "DistributedConfig", "EsConfig", "LoggingConfig",
    "ModelConfig", "OptimConfig", "RolloutConfig", "RunConfig", "RunPlan", "algorithm_of", "apply_overrides",
    "config_from_dict", "config_to_dict", "load_config", "load_run", "plan_from_dict", "plan_run", "read_yaml",
    "read_yaml_mapping",
]  # fmt: skip
