"""The control plane beside the request path: version registry and retention (this package),
later the desired state and the rollout controller. Nothing here runs on the request path."""
