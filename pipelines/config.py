"""Options of the offline pipeline, validated in one place."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.errors import UsageError

# The pipeline's steps, in order (here, not in pipelines.pipeline, so that the CLI can list
# them without importing the training stack).
BUILT_IN = ("movielens", "synthetic")  # the data sets --dataset names (no dataset file)
STEPS = ("prepare", "retrieval", "ranking", "export")


class TrainConfig(BaseModel):
    """Hyper-parameters and sizes; defaults train MovieLens-100K in about a minute on 2 cores."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    seed: int = Field(0, ge=0, description="Seed for the split, sampling, initialisation.")
    split_protocol: Literal["global", "per_user"] = Field(
        "global",
        description="global: one random 8:1:1 split of all interactions; per_user: each "
        "user's interactions split 8:1:1 at random (every user with >= 3 rows has some in "
        "each part).",
    )
    history_length: int = Field(
        20, ge=1, le=500, description="Recent items fed to the query tower."
    )
    history_dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Two-tower training: probability of hiding each history entry.",
    )
    user_id_dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Two-tower training: probability of replacing a user's id by the "
        "out-of-vocabulary id.",
    )
    two_tower_epochs: int = Field(
        30, ge=1, description="Most passes over the retrieval positives (early stopping)."
    )
    two_tower_batch: int = Field(512, ge=2, description="Two-tower batch size.")
    full_softmax_max_items: int = Field(
        10_000,
        ge=0,
        description="Up to this catalog size the two-tower is trained with a full softmax "
        "over every item (the user's other training positives masked); above it with "
        "in-batch sampled softmax and log-Q correction, whose cost per sample does not "
        "grow with the catalog.",
    )
    two_tower_lr: float = Field(
        3e-3, gt=0, description="Adam learning rate of the two-tower model."
    )
    two_tower_dim: int = Field(64, ge=4, description="Output embedding size of both towers.")
    two_tower_history_dim: int = Field(
        32, ge=1, description="Embedding size of the history items in the query tower."
    )
    two_tower_user_feature_dim: int = Field(
        16, ge=1, description="Embedding size of each user id-feature in the query tower."
    )
    two_tower_item_feature_dim: int = Field(
        32,
        ge=1,
        description="Embedding size of each item id-feature (and of the dense features' "
        "projection) in the item tower.",
    )
    two_tower_hidden: int = Field(
        128, ge=4, description="Width of the hidden layer of both towers' MLPs."
    )
    two_tower_linear_skip: bool = Field(
        False,
        description="Both towers: a linear path from the inputs to the output beside the "
        "MLP (wide & deep).",
    )
    two_tower_item_bias: bool = Field(
        True,
        description="A learned per-item bias on the two-tower's logits (a popularity prior); "
        "served as one more dimension of the query and item vectors.",
    )
    two_tower_ensemble: int = Field(
        1,
        ge=1,
        le=16,
        description="Train this many two-towers apart (own initialisation and batch order) "
        "and serve the sum of their logits as one two-tower: query and item vectors are the "
        "members' side by side, so vectors and the ANN index are this many times wider and "
        "training takes this many times longer.",
    )
    temperature: float = Field(
        0.2,
        gt=0,
        description="Softmax temperature of the towers' cosine (0.2 beat 0.1 and 0.3 on "
        "MovieLens validation).",
    )
    bpr_epochs: int = Field(60, ge=1, description="Most epochs of the BPR-MF baseline.")
    bpr_lr: float = Field(5e-3, gt=0, description="Adam learning rate of BPR-MF.")
    bpr_dim: int = Field(64, ge=2, description="Factor size of BPR-MF.")
    bpr_l2: float = Field(
        1e-5, ge=0, description="L2 penalty of BPR-MF on the factors a batch uses."
    )
    ease_max_items: int = Field(
        10_000,
        ge=0,
        description="Train the EASE baseline (closed form, items x items) only up to this "
        "catalog size; larger catalogs skip it (recorded in the report).",
    )
    neighbor_width: int = Field(
        50,
        ge=1,
        description="Item-neighbour source (a baseline, exported as serving's second "
        "retrieval source): neighbours kept per item.",
    )
    neighbor_items_per_user: int = Field(
        50,
        ge=2,
        description="Item-neighbour source: items of each user counted for co-occurrence (a "
        "seeded sample of larger histories; fewer when the pairs would pass 40M).",
    )
    patience: int = Field(
        5,
        ge=1,
        description="Early stopping: validations in a row without improvement before a "
        "model (two-tower, BPR-MF, DLRM) stops; the best validated epoch is kept.",
    )
    eval_every: int = Field(
        1, ge=1, description="Validate the retrieval models every this many epochs."
    )
    valid_users: int = Field(
        2000,
        ge=1,
        description="Retrieval validation during training ranks the full catalog for a "
        "seeded sample of at most this many users (bounds its cost at scale).",
    )
    allow_below_popularity: bool = Field(
        False,
        description="Export even when the two-tower (or the ranker) does not beat the "
        "popularity baseline on validation (recorded in the report and the manifest).",
    )
    dlrm_epochs: int = Field(
        8, ge=1, description="Most DLRM epochs; the best on validation AUC is kept."
    )
    dlrm_batch: int = Field(1024, ge=1, description="DLRM batch size.")
    sharded_embeddings: bool = Field(
        False,
        description="Shard DLRM's embedding tables over the torchrun ranks with TorchRec "
        "(needs torchrec: docs/scaling-out.md); the release is the same.",
    )
    dlrm_lr: float = Field(2e-3, gt=0, description="Adam learning rate of DLRM.")
    dlrm_dim: int = Field(
        16, ge=4, description="Embedding width; float32 rows must be a multiple of 16 bytes."
    )
    gbm_rounds: int = Field(
        400, ge=1, description="Most boosting rounds (early stopping on validation)."
    )
    gbm_max_rows: int = Field(
        10_000_000,
        ge=1,
        description="The tree ranker learns from at most this many training rows, the first "
        "of the shuffled training file (a random sample), held in memory; DLRM reads every "
        "row, a batch at a time.",
    )
    triton_target: Literal["cpu", "gpu", "gpu-tensorrt"] = Field(
        "cpu",
        description="Where the release's ranker scores on Triton: cpu, in the ranker's "
        "python-backend model (the CPU image); gpu, its trees on the FIL backend and DLRM's "
        "dense part on ONNX Runtime, called by the ranker (the GPU image, "
        "Dockerfile.triton-gpu; needs treelite for the export's parity check); "
        "gpu-tensorrt, the same with TensorRT (FP16) under ONNX Runtime. The gateway's "
        "in-process scoring reads any target.",
    )
    eval_users: int = Field(
        10_000,
        ge=1,
        description="Evaluate retrieval on test for every user up to this many, else on a "
        "seeded sample of this many (the same users for every model): at 1M items, on one "
        "core, the two-tower and BPR-MF score the whole catalog in about 5 ms per user, "
        "popularity and the item neighbours give their top items in under 0.2 ms.",
    )
    threads: int = Field(2, ge=1, description="CPU threads for LightGBM.")
    torch_threads: int = Field(
        1,
        ge=1,
        description="Intra-op threads of the torch training steps. On a machine of its "
        "own, set it to the cores (faster epochs; floats are summed in another order, so a "
        "run is not the one-thread run to the digit). 1 by default: where other work shares "
        "the cores (a test suite, a retrain job beside the gateway) a second thread mostly "
        "waits. Measured: docs/training.md.",
    )

    streaming_prepare: Literal["auto", "on", "off"] = Field(
        "auto",
        description="The prepare step of a dataset file's data: on reads the ingested "
        "interactions a partition at a time in bounded memory (global split and all rows "
        "only; one process); off holds them in memory (about a tenth faster; 270 bytes per "
        "interaction); auto: on above 20,000,000 interactions when the other options allow it "
        "(docs/your-data.md). Not for cascade retrain.",
    )
    fit_workers: int | None = Field(
        None,
        ge=1,
        description="Fit the feature workflow and write the ranking rows on a Dask "
        "LocalCluster of this many single-threaded worker processes on 127.0.0.1 (the "
        "`distributed` extra); the fitted workflow equals the one-process fit. Global split "
        "only; not for cascade retrain. Default: in this process (docs/scaling-out.md).",
    )
    dask_scheduler: str | None = Field(
        None,
        min_length=1,
        description="Like --fit-workers, on the running Dask cluster whose scheduler is at "
        "this address (tcp://host:8786); its workers must see --workdir at the same path. "
        "Default: none.",
    )

    @model_validator(mode="after")
    def _one_fit_cluster(self) -> TrainConfig:
        # UsageError passes through pydantic unwrapped: the CLI exits 2 with this line
        if self.fit_workers is not None and self.dask_scheduler is not None:
            raise UsageError(
                "--fit-workers and --dask-scheduler exclude each other: give the number of "
                "local workers or the address of a running scheduler, not both"
            )
        if self.streaming_prepare == "on" and (
            self.split_protocol != "global" or self.fit_workers or self.dask_scheduler
        ):
            raise UsageError(
                "--streaming-prepare on needs --split-protocol global and no "
                "--fit-workers/--dask-scheduler: it splits each partition by its rows' hashes "
                "in this process"
            )
        if self.split_protocol != "global" and (self.fit_workers or self.dask_scheduler):
            raise UsageError(
                "--fit-workers/--dask-scheduler need --split-protocol global: per_user splits "
                "each user's rows by looking at that user's other rows, which a worker "
                "reading its own partition does not see"
            )
        return self

    @field_validator("dlrm_dim")
    @classmethod
    def _multiple_of_16_bytes(cls, value: int) -> int:
        if value % 4:
            raise ValueError("dlrm_dim must be a multiple of 4 (16 bytes of float32)")
        return value
