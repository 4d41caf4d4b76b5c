"""Deciding: the config, the predicates, the specs and machines, the one core, the runner and the event log."""
