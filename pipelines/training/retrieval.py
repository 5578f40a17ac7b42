"""Retrieval step: train the two-tower model and the baselines (popularity, BPR-MF, EASE,
item neighbours), select each on validation, evaluate all with full ranking on test, check
that the two-tower beats popularity on validation, measure the candidate recall of serving's
two sources, and save the models, item embeddings and the neighbour table."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from core.features.ops.categorify import OOV_ID
from core.features.spec import cardinality
from core.features.workflow import Workflow
from core.item_neighbors import DIRECTORY as NEIGHBORS
from core.item_neighbors import ItemNeighbors, merge_candidates
from pipelines.config import TrainConfig
from pipelines.evaluation.metrics import evaluated_users, ranked_tops
from pipelines.evaluation.popularity_check import describe, popularity_check
from pipelines.evaluation.protocol import evaluate_split, split_groups
from pipelines.models.two_tower import ItemTower, QueryTower, TwoTower
from pipelines.models.two_tower_ensemble import TwoTowerEnsemble
from pipelines.prepare import RetrievalData
from pipelines.threads import all_cores
from pipelines.training import distributed
from pipelines.training.baselines import (
    SELECTION_METRIC,
    bpr_scores,
    popularity,
    popularity_scores,
    train_bpr,
    train_ease,
)
from pipelines.training.distributed import SINGLE, Replicas
from pipelines.training.item_neighbors import (
    REPORTED_BUDGET,
    REPORTED_SHARE,
    NeighborRanking,
    build_item_neighbors,
)
from pipelines.training.loop import (
    EarlyStopping,
    device,
    model_device,
    on_device,
    seed_everything,
    train_epochs,
)

Retriever = TwoTower | TwoTowerEnsemble  # what the retrieval step trains, saves and exports


def build_two_tower(workflow: Workflow, n_item_dense: int, config: TrainConfig) -> Retriever:
    """The two-tower of ``config``: one ``TwoTower``, or with ``two_tower_ensemble`` > 1 an
    ensemble of that many, each initialised from the next draws of torch's generator."""
    members = [
        build_member(workflow, n_item_dense, config) for _ in range(config.two_tower_ensemble)
    ]
    return members[0] if len(members) == 1 else TwoTowerEnsemble(members)


def build_member(workflow: Workflow, n_item_dense: int, config: TrainConfig) -> TwoTower:
    """One two-tower with the sizes of ``config``."""
    query = QueryTower(
        [cardinality(workflow, c) for c in workflow.schema.user_tower_columns],
        n_items=cardinality(workflow, "item_id_idx"),
        feature_dim=config.two_tower_user_feature_dim,
        history_dim=config.two_tower_history_dim,
        hidden=config.two_tower_hidden,
        out_dim=config.two_tower_dim,
        skip=config.two_tower_linear_skip,
    )
    item = ItemTower(
        [cardinality(workflow, c) for c in workflow.schema.item_tower_columns],
        n_item_dense,
        feature_dim=config.two_tower_item_feature_dim,
        hidden=config.two_tower_hidden,
        out_dim=config.two_tower_dim,
        bias=config.two_tower_item_bias,
        skip=config.two_tower_linear_skip,
    )
    return TwoTower(query, item, temperature=config.temperature)


@torch.no_grad()
def item_embeddings(model: Retriever, data: RetrievalData) -> np.ndarray:
    """The served vector of every catalog item (one large op: on every core)."""
    model.eval()
    where = model_device(model)
    features = torch.from_numpy(data.item_features).to(where)
    with all_cores():
        items = model.served_items(features, torch.from_numpy(data.item_dense).to(where))
    return items.cpu().numpy()


@torch.no_grad()
def user_embeddings(model: Retriever, data: RetrievalData, users: np.ndarray) -> np.ndarray:
    model.eval()
    where = model_device(model)
    features = torch.from_numpy(data.user_features[users]).to(where)
    query = model.served_query()
    return query(features, torch.from_numpy(data.history[users]).to(where)).cpu().numpy()


def two_tower_scores(
    model: Retriever, data: RetrievalData, items: np.ndarray | None = None
) -> Callable[[np.ndarray], np.ndarray]:
    """Scores over the whole catalog against ``items`` (default: the item embeddings,
    computed once here)."""
    catalog = item_embeddings(model, data) if items is None else items
    return lambda users: user_embeddings(model, data, users) @ catalog.T


class TwoTowerBatches:
    """The two-tower's training batches, gathered with a few whole-batch tensor ops.

    Everything a batch needs is a row of a dense tensor indexed by the batch's positions: the
    user's features and recent history, the positive's id-features, dense features and log-Q.
    Hiding the target from the user's history (the query must not see what it predicts) is
    one whole-batch comparison, no per-row Python.

    Regularisation, drawn per batch from the same seeded generator: each history entry is
    hidden with probability ``history_dropout`` (the query learns to complete a partial
    history, as a denoising autoencoder does), and the user's id is replaced by the
    out-of-vocabulary id with probability ``user_id_dropout`` (the query cannot simply
    memorise each user's training positives in the id's row, and the OOV row, which serves
    users unknown to the workflow, gets trained).

    With ``full_softmax`` a batch is instead ``(user features, history, target positions,
    excluded)`` for ``TwoTower.catalog_loss``: ``excluded`` ``[B, n_items]`` marks each
    user's training positives (built from a users x items CSR index, again no per-row
    Python), so that none of them is a negative.

    Data-parallel (``replicas.world`` > 1): every rank draws the same global batches (the
    same seeded generator) and gathers only its own contiguous ``1/world`` of each; the
    random draws are made for the whole global batch and sliced, so the ranks' shares put
    together are the single process's batch. Of a last batch that does not split evenly,
    the ``len % world`` rows past the last share are left out (fewer than ``world`` rows an
    epoch).
    """

    def __init__(
        self,
        data: RetrievalData,
        batch: int,
        seed: int,
        full_softmax: bool = False,
        history_dropout: float = 0.0,
        user_id_dropout: float = 0.0,
        replicas: Replicas = SINGLE,
    ) -> None:
        self.pairs = torch.from_numpy(data.positives["train"])
        self.user_features = torch.from_numpy(data.user_features)
        self.history = torch.from_numpy(data.history)
        self.item_features = torch.from_numpy(data.item_features)
        self.item_dense = torch.from_numpy(data.item_dense)
        self.log_q = torch.from_numpy(data.item_log_q)
        self.item_idx = self.item_features[:, 0]
        self.batch = batch
        self.generator = torch.Generator().manual_seed(seed)
        self.full_softmax = full_softmax
        self.history_dropout = history_dropout
        self.user_id_dropout = user_id_dropout
        self.replicas = replicas
        order = torch.argsort(self.pairs[:, 0], stable=True)
        self.liked = self.pairs[order, 1]  # training positives grouped by user
        self.bounds = torch.searchsorted(
            self.pairs[order, 0].contiguous(), torch.arange(len(data.user_ids) + 1)
        )

    def __len__(self) -> int:
        full, rest = divmod(len(self.pairs), self.batch)
        return full + (rest >= self.replicas.world)

    def excluded(self, users: torch.Tensor) -> torch.Tensor:
        """``[len(users), n_items]``: True where the item is one of the user's training
        positives."""
        starts = self.bounds[users]
        lengths = self.bounds[users + 1] - starts
        row = torch.repeat_interleave(torch.arange(len(users)), lengths)
        offsets = torch.arange(int(lengths.sum())) - torch.repeat_interleave(
            torch.cumsum(lengths, 0) - lengths, lengths
        )
        mask = torch.zeros(len(users), len(self.item_idx), dtype=torch.bool)
        mask[row, self.liked[torch.repeat_interleave(starts, lengths) + offsets]] = True
        return mask

    def gather(self, batch_rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """This rank's share of the global batch ``batch_rows`` (all of it when alone; the
        ``len % world`` rows past the last share are left out)."""
        size = len(batch_rows) // self.replicas.world
        mine = slice(self.replicas.rank * size, (self.replicas.rank + 1) * size)
        rows = batch_rows[mine]
        users, items = self.pairs[rows, 0], self.pairs[rows, 1]
        recent = self.history[users]
        hidden = recent == self.item_idx[items][:, None]
        if self.history_dropout > 0:
            draws = torch.rand((len(batch_rows), recent.shape[1]), generator=self.generator)
            hidden |= draws[mine] < self.history_dropout
        recent = recent.masked_fill(hidden, 0)
        features = self.user_features[users]
        if self.user_id_dropout > 0:
            draws = torch.rand(len(batch_rows), generator=self.generator)
            features[:, 0] = features[:, 0].masked_fill(draws[mine] < self.user_id_dropout, OOV_ID)
        if self.full_softmax:
            return features, recent, items, self.excluded(users)
        return (
            features,
            recent,
            self.item_features[items],
            self.item_dense[items],
            items,
            self.log_q[items],
        )

    def epoch(self, _: int) -> Any:
        order = torch.randperm(len(self.pairs), generator=self.generator)
        world = self.replicas.world
        return (self.gather(rows) for rows in order.split(self.batch) if len(rows) >= world)


def train_retriever(
    model: Retriever,
    data: RetrievalData,
    config: TrainConfig,
    report: Callable[[str], None] | None = None,
    quiet: bool = False,
) -> dict[str, list[dict[str, float]]]:
    """Train the two-tower, or each member of an ensemble in turn with its own batch order
    (member k draws its batches from seed ``config.seed + k``); the training curves by name
    (``two_tower``, or ``two_tower member k`` from 1)."""
    if isinstance(model, TwoTower):
        return {"two_tower": train_two_tower(model, data, config, report, quiet)}
    members = model.towers()
    return {
        f"two_tower member {k + 1}": train_two_tower(
            member,
            data,
            config.model_copy(update={"seed": config.seed + k}),
            report,
            quiet,
            name=f"two-tower {k + 1}/{len(members)}",
        )
        for k, member in enumerate(members)
    }


def train_two_tower(
    model: TwoTower,
    data: RetrievalData,
    config: TrainConfig,
    report: Callable[[str], None] | None = None,
    quiet: bool = False,
    name: str = "two-tower",
) -> list[dict[str, float]]:
    """Train with early stopping and keep-best on validation NDCG@10 (sampled users).

    The loss is the full softmax over the catalog when it has at most
    ``config.full_softmax_max_items`` items, else in-batch sampled softmax with log-Q.
    Data-parallel (inside ``distributed.run_on_all``): each rank trains on its share of
    every global batch of ``config.two_tower_batch``, and the in-batch softmax's negatives
    are the positives of the whole global batch (gathered from every rank)."""
    full = len(data.item_ids) <= config.full_softmax_max_items
    place = distributed.replicas()
    place.share(config.two_tower_batch, "--two-tower-batch")  # a ConfigError unless it divides
    batches = TwoTowerBatches(
        data,
        config.two_tower_batch,
        config.seed,
        full_softmax=full,
        history_dropout=config.history_dropout,
        user_id_dropout=config.user_id_dropout,
        replicas=place,
    )
    model.to(device())  # batches are built on the CPU; train_epochs moves each one
    where = model_device(model)
    # the full softmax scores every item each step: its item inputs live beside the model
    catalog = on_device((batches.item_features, batches.item_dense), where) if full else ()
    gather = distributed.gather_rows if place.parallel else None  # the global batch's negatives

    def loss(*batch: torch.Tensor) -> torch.Tensor:
        if full:
            features, history, targets, excluded = batch
            return model.catalog_loss(features, history, targets, excluded, *catalog)
        users, history, items, dense, ids, log_q = batch
        return model.loss(users, history, items, dense, ids, log_q, gather, place.rank * len(ids))

    def validate(_: int) -> dict[str, float]:
        metrics = evaluate_split(two_tower_scores(model, data), data, "valid", config.valid_users)
        model.train()
        return {f"valid_{name}": value for name, value in metrics.items()}

    model.train()
    curve = train_epochs(
        model,
        batches.epoch,
        loss,
        config.two_tower_epochs,
        config.two_tower_lr,
        name,
        stopping=EarlyStopping(
            validate, f"valid_{SELECTION_METRIC}", config.patience, config.eval_every
        ),
        batches_per_epoch=len(batches),
        report=report,
        quiet=quiet,
        replicas=place,
    )
    model.cpu()  # evaluation and export run on the CPU
    return curve


def evaluate_two_tower(
    model: Retriever, data: RetrievalData, split: str = "test", max_users: int | None = None
) -> dict[str, float]:
    return evaluate_split(two_tower_scores(model, data), data, split, max_users)


def kept_record(curve: list[dict[str, float]]) -> dict[str, float]:
    """The record of the epoch whose weights early stopping kept."""
    return next(record for record in curve if record.get("best"))


def retriever_validation(
    curves: dict[str, list[dict[str, float]]],
    scores: Callable[[np.ndarray], np.ndarray],
    data: RetrievalData,
    config: TrainConfig,
) -> dict[str, float]:
    """Validation metrics of what ``train_retriever`` trained (``curves``): one two-tower's
    are those of its kept epoch (no second full ranking: at 1M items each costs about
    20 s); an ensemble's members were validated one by one, so its summed ``scores`` are
    ranked on the validation users."""
    if "two_tower" in curves:
        return kept_validation(curves["two_tower"])
    return evaluate_split(scores, data, "valid", config.valid_users)


def kept_validation(curve: list[dict[str, float]]) -> dict[str, float]:
    """The validation metrics of the epoch whose weights early stopping kept."""
    kept = kept_record(curve)
    return {k.removeprefix("valid_"): v for k, v in kept.items() if k.startswith("valid_")}


def history_positions(data: RetrievalData) -> list[np.ndarray]:
    """Each user's recent history (what serving's neighbour source reads) as item positions."""
    lookup = np.full(int(data.item_features[:, 0].max()) + 1, -1, np.int64)
    lookup[data.item_features[:, 0]] = np.arange(len(data.item_ids))
    lookup[OOV_ID] = -1  # an item the workflow does not know is no item in particular
    positions = [lookup[row[row > 0]] for row in data.history]
    return [p[p >= 0] for p in positions]


def candidate_sources(
    two_tower: Callable[[np.ndarray], np.ndarray],
    neighbors: ItemNeighbors,
    histories: list[np.ndarray],
    data: RetrievalData,
    max_users: int | None,
    budget: int = REPORTED_BUDGET,
    share: int = REPORTED_SHARE,
) -> dict[str, float]:
    """Test recall of the candidate set serving would retrieve, ``budget`` items: the ANN
    alone against the ANN with ``share`` of them from the neighbour source (what the ANN did
    not find; ``merge_candidates``), as serving merges them. One scoring pass: both sets
    come from the same top ``budget``."""
    truth, seen = split_groups(data, "test")
    users = evaluated_users(truth, max_users)
    union = f"ann+item_neighbors_{share}"
    found = {"ann": 0.0, union: 0.0}
    for user, ann in ranked_tops(two_tower, users, seen, budget):
        extra, _ = neighbors.candidates(histories[user], share, seen[user])
        merged, _ = merge_candidates(ann, extra, budget)
        found["ann"] += np.isin(ann, truth[user]).sum() / len(truth[user])
        found[union] += np.isin(merged, truth[user]).sum() / len(truth[user])
    recalls = {name: float(hits) / max(len(users), 1) for name, hits in found.items()}
    return {"budget": budget, **{f"recall@{budget} {k}": v for k, v in recalls.items()}}


def train_retrieval_models(
    workdir: Path, config: TrainConfig, report: Callable[[str], None] | None = None
) -> tuple[RetrievalData, Retriever, dict[str, list[dict[str, float]]]]:
    """The data, the trained two-tower and its curves (``train_retriever``), seeded."""
    seed_everything(config.seed)
    torch.set_num_threads(config.torch_threads)
    data = RetrievalData.load(workdir / "retrieval.npz")
    workflow = Workflow.load(workdir / "workflow")
    model = build_two_tower(workflow, data.item_dense.shape[1], config)
    return data, model, train_retriever(model, data, config, report)


def run_retrieval(
    workdir: Path, config: TrainConfig, report: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Train, evaluate and save; returns metrics, validation metrics, the popularity check
    and training curves (also saved as ``retrieval_result.json``).

    ``report`` gets one line per epoch (see ``train_epochs``). Under a launcher (torchrun)
    the two-tower trains on every rank (``train_retrieval_models``), the rest on rank 0."""
    emit = report or print
    data, model, two_tower_curves = distributed.run_on_all(
        train_retrieval_models, workdir, config, report=report
    )
    bpr, bpr_curve = train_bpr(data, config, report)
    ease, ease_info = train_ease(data, config, report)
    started = time.perf_counter()
    neighbors = build_item_neighbors(
        data.positives["train"],
        len(data.item_ids),
        config.neighbor_width,
        config.neighbor_items_per_user,
        config.seed,
    )
    took = time.perf_counter() - started
    emit(f"item neighbours: {config.neighbor_width} per item, built in {took:.1f} s")
    histories = history_positions(data)
    items = item_embeddings(model, data)  # scored against here, saved below
    scorers: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "two_tower": two_tower_scores(model, data, items),
        "bpr_mf": bpr_scores(bpr),
        "popularity": popularity_scores(data),
        "item_neighbors": NeighborRanking(neighbors, histories),
    }
    if ease is not None:
        scorers["ease"] = ease.scores
    # the trained models' validation metrics are those of their kept epochs (no second full
    # ranking of the validation users: at 1M items each costs about 20 s)
    valid: dict[str, dict[str, float]] = {
        "two_tower": retriever_validation(two_tower_curves, scorers["two_tower"], data, config),
        "bpr_mf": kept_validation(bpr_curve),
    }
    for name, scores in scorers.items():
        if name not in valid:
            valid[name] = evaluate_split(scores, data, "valid", config.valid_users)
    check = popularity_check(
        "two_tower",
        valid["two_tower"][SELECTION_METRIC],
        "popularity",
        valid["popularity"][SELECTION_METRIC],
        SELECTION_METRIC,
        config.allow_below_popularity,
    )
    emit(describe(check))
    result = {
        "metrics": {
            n: evaluate_split(s, data, "test", config.eval_users) for n, s in scorers.items()
        },
        "valid_metrics": valid,
        "popularity_check": check,
        "baselines": {"ease": ease_info},
        # on the validation-sized sample of test users: two more full rankings of the catalog
        "candidate_sources": candidate_sources(
            scorers["two_tower"], neighbors, histories, data, config.valid_users
        ),
        "curves": {**two_tower_curves, "bpr_mf": bpr_curve},
    }
    models = workdir / "models"
    models.mkdir(exist_ok=True)
    torch.save(model.state_dict(), models / "two_tower.pt")
    np.save(models / "item_embeddings.npy", items)
    np.save(models / "popularity.npy", popularity(data))
    neighbors.save(models / NEIGHBORS)
    (workdir / "retrieval_result.json").write_text(json.dumps(result, indent=2))
    return result
