"""Judge a researcher's own advantage estimator, policy loss or KL estimator: ``posttrain arena module:function``.

`judge` (and the ``posttrain arena`` command) runs four sections on one function of the package's
signature for its kind (`posttrain.arena.kinds`) and returns an `ArenaReport`:

1. **contract** (`posttrain.arena.contract`): the estimator contract every public estimator of the
   package passes (`posttrain.testing.contract_findings`) and the properties of its form
   (`posttrain.arena.properties`), searched with hypothesis; each failure one line with a shrunk input;
2. **conventions** (`posttrain.arena.conventions`): the registered estimators and framework modes
   (verl, TRL, OpenRLHF) it equals numerically, and the first input where it departs from the closest;
3. **exact toys** (`posttrain.arena.exact`): the bias and variance of its gradient against the exact
   policy gradient of a bandit and a tabular policy at several group sizes, with Monte Carlo errors;
4. **learning curves** (`posttrain.arena.curves`): paired seeds against baselines on an exact toy,
   judged on endpoints fixed in advance with the paper checks' finite-sample statistics:
   better / worse / indistinguishable (with the minimum detectable effect).

The report is written as markdown, JSON and a PNG (`posttrain.arena.report`) and summarised on one
screen (`posttrain.arena.summary`). Needs the ``[testing]`` extra (hypothesis) and, for the figure,
``[plots]``.

Examples:
    >>> import torch
    >>> from posttrain.arena import judge
    >>> def my_rloo(rewards):
    ...     k = rewards.shape[-1]
    ...     return rewards - (rewards.sum(-1, keepdim=True) - rewards) / (k - 1)
    >>> report = judge(my_rloo, seeds=8)  # doctest: +SKIP
    >>> report.equal_to  # doctest: +SKIP
    ['rloo']
"""

from posttrain.arena.curves import CurveConfig
from posttrain.arena.exact import Budget
from posttrain.arena.kinds import Kind, load_function
from posttrain.arena.report import ArenaReport
from posttrain.arena.run import judge

__all__ = ["ArenaReport", "Budget", "CurveConfig", "Kind", "judge", "load_function"]
