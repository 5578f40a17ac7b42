"""Drift counting on the request path: per-version windows of binned feature values
compared with each version's reference (``core/export/drift_reference.py``)."""
