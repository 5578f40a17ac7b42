"""Raw datasets (MovieLens-100K, synthetic) in one schema."""

from pipelines.data.schema import RawDataset

__all__ = ["RawDataset"]
