"""Training steps: retrieval (two-tower and baselines) and ranking (DLRM, GBM, blend)."""
