"""PyTorch and tree models: two-tower retrieval, BPR-MF and popularity baselines, DLRM, GBM."""
