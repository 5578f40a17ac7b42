"""Metrics and the evaluation report."""
