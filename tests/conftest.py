"""Test-wide settings: hypothesis profiles and runtime shape checking.

Profiles: ``ci`` (derandomised, so CI is reproducible), ``dev`` (default, random), ``thorough``
(many examples). Select with ``HYPOTHESIS_PROFILE``.
"""

from __future__ import annotations

import os

import torch
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", max_examples=60, deadline=None)
settings.register_profile("thorough", max_examples=1000, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

torch.set_num_threads(1)  # tests run in parallel workers on a 2-core machine
