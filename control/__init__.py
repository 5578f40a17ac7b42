"""The continuous-training loop, above both halves: the retrain job (``retrain``), the
validation gate (``validation``), the version registry and retention, the rollout controller
and its analysis (``rollout``), dashboards as code (``dashboards``) and the traffic simulator."""
