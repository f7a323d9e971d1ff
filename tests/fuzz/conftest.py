"""Hypothesis profiles of the property tests: ``default`` (a few cases per test, in make unit) and ``fuzz``
(thousands, for a long run), chosen by the environment variable HYPOTHESIS_PROFILE.

``default`` is derandomized: make test draws the same cases on every run, so that CI passes or
fails on the code, not on the luck of a draw; ``fuzz`` draws new cases each time, to find new
failures (each one found is then kept as a regression test)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "default", max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "fuzz", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
