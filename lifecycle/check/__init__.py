"""Checking: the checker's world, the explorer, the invariants and the spec mutants."""
