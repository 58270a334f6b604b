"""Per-seed claims ("in every seed", "in >= f of the seeds") as quantile criteria: counted, Clopper-Pearson-judged."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from posttrain.paper_checks.model import ALPHA, Criterion, quantile_criterion
from posttrain.paper_checks.stats import Outcome, compare


@given(
    d=st.lists(st.floats(-1, 1), min_size=1, max_size=16),
    margin=st.floats(-0.5, 0.5),
    share=st.sampled_from([0.5, 0.8, 0.9]),
)
def test_quantile_criterion_counts_seeds_and_bounds_the_share(d: list[float], margin: float, share: float) -> None:
    c = quantile_criterion("x", d, margin=margin, share=share, reason="test")
    n, count = len(d), sum(x > margin for x in d)
    st_ = compare(c)
    assert st_.count == count and st_.estimate == count / n and c.kind is Criterion.QUANTILE
    assert c.differences == tuple(d)
    # holds <=> the exact one-sided binomial test rejects "P(d > margin) <= share" (Clopper-Pearson duality)
    rejects = count > 0 and stats.binomtest(count, n, share, alternative="greater").pvalue <= ALPHA
    assert (st_.outcome is Outcome.HOLDS) == rejects
    # excluded <=> the test of "P(d > margin) >= share" rejects in the other direction
    below = count < n and stats.binomtest(count, n, share, alternative="less").pvalue <= ALPHA
    assert (st_.outcome is Outcome.EXCLUDED) == below
