r"""Several domains with very different response lengths sharing one low-capacity student (the paper's (docs: methods/open_mopd.md) toy).

Each domain d has its own pool of states (contexts); a response of domain d is a sequence of
``lengths[d]`` states drawn uniformly from the pool. The student is a shared linear softmax,
$\mathrm{logits}(s) = \phi(s)^\top U$ with fixed random features $\phi(s)\in\mathbb R^D$
($\mathcal N(0,1)/\sqrt D$) and trainable $U\in\mathbb R^{D\times V}$; each domain has
its own linear teacher $\phi(s)^\top U^*_d$ (individually representable, conflicting
jointly), so domains compete for the student's capacity. Everything carries a leading seed axis.
Capability of a domain: mean over its states of $p_S(\arg\max p_T\mid s)$ (exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from posttrain.simulators._base import SeedRNG

__all__ = ["MultiDomainTask"]


@dataclass(frozen=True)
class MultiDomainTask:
    """Per seed: features ``[S, D*P, F]`` of every state (domain-major), teacher log-probs ``[S, D*P, V]``."""

    features: Tensor
    teacher_logp: Tensor
    states_per_domain: int
    lengths: tuple[int, ...]

    @classmethod
    def random(
        cls,
        seeds: int | Sequence[int],
        *,
        lengths: tuple[int, ...] = (24, 20, 2),
        states_per_domain: int = 30,
        feature_dim: int = 64,
        vocab: int = 8,
        teacher_scale: float = 8.0,
    ) -> MultiDomainTask:
        """Seed s uses generator ``800 + s``; teachers $U^*_d \\sim \\mathcal N(0, \\text{scale}^2)$.

        ``seeds``: the seeds themselves, or a count ``n`` for seeds ``0 .. n-1``.
        """
        n_dom, p = len(lengths), states_per_domain
        feats, teach = [], []
        for s in range(seeds) if isinstance(seeds, int) else seeds:  # one environment per seed (a few tiny draws)
            gen = torch.Generator().manual_seed(800 + s)
            phi = torch.randn(n_dom * p, feature_dim, generator=gen, dtype=torch.float64) / feature_dim**0.5
            u_star = teacher_scale * torch.randn(n_dom, feature_dim, vocab, generator=gen, dtype=torch.float64)
            logits = torch.einsum("dpf,dfv->dpv", phi.reshape(n_dom, p, feature_dim), u_star).reshape(n_dom * p, vocab)
            feats.append(phi)
            teach.append(logits.log_softmax(-1))
        return cls(torch.stack(feats), torch.stack(teach), p, lengths)

    @property
    def num_domains(self) -> int:
        return len(self.lengths)

    def state_domain(self) -> Tensor:
        """``[D*P]`` domain of every state."""
        return torch.arange(self.num_domains).repeat_interleave(self.states_per_domain)

    def sample_states(self, prompt_domain: Tensor, rng: SeedRNG) -> tuple[Tensor, Tensor]:
        """``(states [S, B, T], mask [B, T])`` for prompts of the given domains ``[B]``; T = max length."""
        t = max(self.lengths)
        lens = torch.tensor(self.lengths)[prompt_domain]
        u = rng.rand(prompt_domain.shape[0], t)
        local = (u * self.states_per_domain).long().clamp(max=self.states_per_domain - 1)
        states = prompt_domain.unsqueeze(-1) * self.states_per_domain + local
        mask = torch.arange(t).unsqueeze(0) < lens.unsqueeze(-1)
        return states, mask

    def capability(self, student_logp: Tensor) -> Tensor:
        """``[*lead, S, D]`` mean over each domain's states of $p_S(\\arg\\max p_T)$; ``student_logp [*lead, S, D*P, V]``."""
        best = self.teacher_logp.argmax(-1, keepdim=True).expand(*student_logp.shape[:-1], 1)
        p = student_logp.gather(-1, best)[..., 0].exp()
        return p.reshape(*p.shape[:-1], self.num_domains, self.states_per_domain).mean(-1)

    def teacher_capability(self) -> Tensor:
        """``[S, D]`` the teacher's own capability $\\max_v p_T(v)$ averaged over states."""
        return self.capability(self.teacher_logp)
