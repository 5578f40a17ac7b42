"""Feature engineering: small fitted operators chained into one saved, reusable workflow."""

from pipelines.features.workflow import Workflow

__all__ = ["Workflow"]
