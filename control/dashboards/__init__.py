"""Dashboards as code: one set of panel definitions (``panels``) drawn by Grafana (``grafana``
writes the provisioned JSON) and, without Grafana, rendered to PNG by ``cascade report``."""
