"""Toy environments that know their exact answers (bandits, tabular autoregressive policies, ...).

Core API (other simulator modules may be imported directly from their files):

- `_base`: `SeedRNG` (one generator per seed), `Rollout`,
  the `ToyEnv` protocol the loop needs;
- `bandits`: `SoftmaxBandit` and exact bandit quantities;
- `tabular`: `TabularSpec`, `TabularEnv`, verifiers;
- `loop`: `train` with an `EstimatorBundle`.
"""

from posttrain.simulators._base import Rollout, SeedRNG, ToyEnv, sample_categorical, uniform
from posttrain.simulators.bandits import (
    SoftmaxBandit,
    bandit_entropy,
    bandit_kl,
    expected_reward,
    reward_gradient,
    sample_arms,
    success_prob,
)
from posttrain.simulators.loop import EstimatorBundle, TrainLog, bundle, train
from posttrain.simulators.tabular import (
    HammingVerifier,
    TabularEnv,
    TabularSpec,
    TargetVerifier,
    boost_sequences,
    enumerate_sequences,
    sample_sequences,
    sequence_logp,
    token_logp,
)

__all__ = [
    "EstimatorBundle",
    "HammingVerifier",
    "Rollout",
    "SeedRNG",
    "SoftmaxBandit",
    "TabularEnv",
    "TabularSpec",
    "TargetVerifier",
    "ToyEnv",
    "TrainLog",
    "bandit_entropy",
    "bandit_kl",
    "boost_sequences",
    "bundle",
    "enumerate_sequences",
    "expected_reward",
    "reward_gradient",
    "sample_arms",
    "sample_categorical",
    "sample_sequences",
    "sequence_logp",
    "success_prob",
    "token_logp",
    "train",
    "uniform",
]
