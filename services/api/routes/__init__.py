"""One APIRouter per module."""
