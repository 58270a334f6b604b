"""Adapters that run our estimators inside verl and TRL, for multi-GPU scale.

- `posttrain.llm.adapters.verl`: registers advantage estimators and policy losses in verl's
  registries under ``posttrain_*`` names (a ``verl.plugins`` entry point; importing it is the plugin).
- `posttrain.llm.adapters.trl`: ``PosttrainGRPOTrainer``, TRL's ``GRPOTrainer`` whose advantages and loss
  are our estimators: TRL's own settings reproduced (`posttrain.llm.adapters.trl_recipe`) or refused
  (`posttrain.llm.adapters.trl_fields`, which classifies every ``GRPOConfig`` field), or our advantage,
  policy loss and aggregation in their place.
- `posttrain.llm.adapters.rewards`: reward functions over our verifiers and tasks, in verl's
  ``compute_score`` and TRL's ``reward_funcs`` signatures (no verl or TRL import).
- `posttrain.llm.adapters.convert`: the plain conversions between their argument conventions and ours.

Nothing here imports verl or TRL at package import; see ``docs/adapters.md``.
"""
