"""Options of the offline pipeline, validated in one place."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The pipeline's steps, in order (here, not in pipelines.pipeline, so that the CLI can list
# them without importing the training stack).
STEPS = ("prepare", "retrieval", "ranking", "export")


class TrainConfig(BaseModel):
    """Hyper-parameters and sizes; defaults train MovieLens-100K in about a minute on 2 cores."""

    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, description="Seed for the split, sampling, initialisation.")
    history_length: int = Field(
        20, ge=1, le=500, description="Recent items fed to the query tower."
    )
    two_tower_epochs: int = Field(25, ge=1, description="Passes over the retrieval positives.")
    two_tower_batch: int = Field(512, ge=2, description="In-batch softmax size.")
    two_tower_lr: float = Field(
        3e-3, gt=0, description="Adam learning rate of the two-tower model."
    )
    two_tower_dim: int = Field(64, ge=4, description="Output embedding size of both towers.")
    temperature: float = Field(0.1, gt=0, description="Softmax temperature of the towers' cosine.")
    bpr_epochs: int = Field(40, ge=1, description="Epochs of the BPR-MF baseline.")
    bpr_lr: float = Field(5e-3, gt=0, description="Adam learning rate of BPR-MF.")
    dlrm_epochs: int = Field(
        5, ge=1, description="DLRM epochs; the best on validation AUC is kept."
    )
    dlrm_batch: int = Field(1024, ge=1, description="DLRM batch size.")
    dlrm_lr: float = Field(2e-3, gt=0, description="Adam learning rate of DLRM.")
    dlrm_dim: int = Field(
        16, ge=4, description="Embedding width; float32 rows must be a multiple of 16 bytes."
    )
    gbm_rounds: int = Field(
        400, ge=1, description="Most boosting rounds (early stopping on validation)."
    )
    eval_users: int | None = Field(
        None,
        ge=1,
        description="Evaluate retrieval on a seeded sample of this many users (all if unset).",
    )
    threads: int = Field(2, ge=1, description="CPU threads for torch and LightGBM.")

    @field_validator("dlrm_dim")
    @classmethod
    def _multiple_of_16_bytes(cls, value: int) -> int:
        if value % 4:
            raise ValueError("dlrm_dim must be a multiple of 4 (16 bytes of float32)")
        return value
