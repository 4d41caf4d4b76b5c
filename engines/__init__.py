"""Engines: the engine machine driving real inference servers (the CPU torch engine, SGLang).

The engine *lifecycle* is :data:`lifecycle.decide.machines.ENGINE`; :class:`engines.engine.Engine` drives
it against a real process through a launcher (``engines.launcher.LocalLauncher`` or
``engines.actor.RayLauncher``), talking SGLang's HTTP API through ``engines.client.EngineClient``.
The CPU torch engine program itself is the :mod:`engines.cpu` package (``python -m engines.cpu``).
"""
