"""Shared test settings.

* Hypothesis profiles: ``dev`` (fast, default) and ``ci`` (thorough, selected by ``CI=true``).
* ``LIFECYCLE_REQUIRE_ALL=1`` (set by ``.ci/run``) turns a skip for a missing tool (graphviz,
  chromium, playwright, mermaid) into a failure, so CI cannot go green by skipping.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None)
settings.load_profile("ci" if os.environ.get("CI", "").strip().lower() == "true" else "dev")

_MISSING_TOOL_WORDS = ("install", "not installed")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("LIFECYCLE_REQUIRE_ALL") != "1":
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(word in reason for word in _MISSING_TOOL_WORDS):
        report.outcome = "failed"
        report.longrepr = f"LIFECYCLE_REQUIRE_ALL=1 but a required tool is missing: {reason}"


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One real local Ray cluster per test session (2 CPUs, no dashboard); only if a test asks."""
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'rl-lifecycle[ray]'")
    from engines.actor import init_local_cluster

    init_local_cluster(num_cpus=2)
    yield
    ray.shutdown()
