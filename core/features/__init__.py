"""Feature engineering: small fitted operators chained into one saved, reusable workflow."""

from core.features.workflow import Workflow

__all__ = ["Workflow"]
