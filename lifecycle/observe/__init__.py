"""Observing: the live invariant monitor, traces, the run timeline, explanations."""
