r"""Response columns in chunks, so that rows leave the training forward once their responses have ended.

A batch of B responses is right-padded to its longest: one forward over ``[B, S]`` computes the padding
after every shorter response, and the LM head there. Splitting the columns at boundaries
$0 = c_0 < c_1 < \dots < c_m = S$ and feeding chunk $j$ (columns $[c_j, c_{j+1})$) only for the rows
still running at $c_j$ (on top of the KV cache of the earlier chunks) costs

$$
\sum_{j<m} (c_{j+1} - c_j)\,\#\{r : f_r > c_j\} + m\,o
$$

token positions, $f_r$ the columns row $r$ needs and $o$ the fixed cost of one more forward call
in token positions. `plan_chunks` minimises it over boundaries at row ends (dynamic programming).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from posttrain.errors import DomainError

__all__ = ["chunk_cost", "plan_chunks"]

MAX_CANDIDATES = 32
"""Boundaries considered by `plan_chunks` (row ends; evenly spaced among them when there are more)."""


def chunk_cost(fed: Sequence[int], bounds: Sequence[int], overhead: float) -> float:
    """The cost (see the module) of feeding ``fed[r]`` columns of each row in the chunks ``bounds``.

    Examples:
        >>> chunk_cost([4, 1, 1, 1], [0, 4], 0.0), chunk_cost([4, 1, 1, 1], [0, 1, 4], 0.0)
        (16.0, 7.0)
    """
    return sum((b - a) * sum(f > a for f in fed) + overhead for a, b in itertools.pairwise(bounds))


def plan_chunks(fed: Sequence[int], *, overhead: float, max_chunks: int = 8) -> list[int]:
    """Chunk boundaries ``[0, ..., max(fed)]`` of least `chunk_cost` (at most ``max_chunks`` chunks).

    Args:
        fed: the columns each row needs fed, non-negative (0: none).
        overhead: the cost of each chunk in token positions, non-negative.
        max_chunks: at most this many chunks, positive.

    Returns:
        The boundaries; ``[0]`` when no row needs a column.

    Examples:
        >>> plan_chunks([8, 8, 2, 2, 2, 2, 2, 2], overhead=1.0)
        [0, 2, 8]
        >>> plan_chunks([8, 8, 2, 2, 2, 2, 2, 2], overhead=100.0)
        [0, 8]
    """
    if any(f < 0 for f in fed) or overhead < 0 or max_chunks < 1:
        raise DomainError(
            f"plan_chunks: expected fed >= 0, overhead >= 0, max_chunks >= 1; got {overhead}, {max_chunks}"
        )
    ends = sorted({int(f) for f in fed if f > 0})
    if not ends:
        return [0]
    if len(ends) > MAX_CANDIDATES:
        step = len(ends) / MAX_CANDIDATES
        ends = sorted({ends[int(i * step)] for i in range(MAX_CANDIDATES)} | {ends[-1]})
    cands = [0, *ends]
    alive = [sum(f > c for f in fed) for c in cands]
    n, inf = len(cands), float("inf")
    best = [[inf] * n for _ in range(max_chunks + 1)]  # best[j][i]: columns [0, cands[i]) in j chunks
    back = [[0] * n for _ in range(max_chunks + 1)]
    best[0][0] = 0.0
    for j in range(1, max_chunks + 1):
        for i in range(1, n):
            for a in range(i):
                cost = best[j - 1][a] + (cands[i] - cands[a]) * alive[a] + overhead
                if cost < best[j][i]:
                    best[j][i], back[j][i] = cost, a
    j = min(range(1, max_chunks + 1), key=lambda m: best[m][n - 1])
    bounds, i = [cands[-1]], n - 1
    while j > 0:
        i = back[j][i]
        bounds.append(cands[i])
        j -= 1
    return bounds[::-1]
