"""Hypothesis profiles: ``dev`` (fast, default) and ``ci`` (thorough, selected by ``CI=true``)."""

import os

from hypothesis import settings

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None)
settings.load_profile("ci" if os.environ.get("CI", "").strip().lower() == "true" else "dev")
