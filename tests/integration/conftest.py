"""Fixtures of the integration tests: real Prometheus and Alertmanager (monitoring_servers)."""

from tests.integration.monitoring_servers import alertmanager_server, prometheus_server

__all__ = ["alertmanager_server", "prometheus_server"]
