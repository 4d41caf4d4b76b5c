"""Observability of the lifecycle: a Prometheus exporter fed by the event log (``pip install 'rl-lifecycle[metrics]'``).

``serve_metrics(runner.log, port)`` is the one call an embedding loop makes; ``lifecycle run --metrics-port``
makes it for the project's own loop.
"""

from telemetry.metrics import Metrics, MetricsServer, serve_metrics

__all__ = ["Metrics", "MetricsServer", "serve_metrics"]
