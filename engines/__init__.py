"""Engines: the engine machine driving real inference servers (CPU torch engine, SGLang).

Thin for now: the engine *lifecycle* lives in :data:`lifecycle.machines.ENGINE`; the processes,
HTTP client and health monitor arrive with the Engines issue.
"""
