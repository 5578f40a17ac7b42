"""Hierarchical embedding cache for DLRM scoring: device tier -> host tier -> Redis."""
