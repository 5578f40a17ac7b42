"""The control plane's shared state as the gateway sees it: the desired state (read by the
follower, written by the rollout controller), the follower itself, and the retrain queue that
alerts fill."""
