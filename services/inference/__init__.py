"""Model inference for the gateway: query tower and ranker, in process or on Triton."""
