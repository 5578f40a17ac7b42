"""The GPU paths, run where a CUDA device exists (skipped elsewhere, CI included): the
embedding cache's device tier, mixed-precision training, and FAISS on the GPU when the
installed faiss has GPU support. Each compares against the CPU path in the same test."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CUDA, CPU = torch.device("cuda"), torch.device("cpu")


class TableRows:
    """The cache's backing store reduced to what it reads: rows of each table by key."""

    def __init__(self, tables: dict[str, np.ndarray]) -> None:
        self.tables = tables
        self.reads = 0

    def fetch_many(
        self, version: int, wanted: list[tuple[str, np.ndarray]], dim: int
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        self.reads += 1
        return [(self.tables[t][k], np.ones(len(k), dtype=bool)) for t, k in wanted]

    def close(self) -> None:
        self.tables = {}


def test_the_device_tier_on_the_gpu_answers_exactly_like_the_cpu_one() -> None:
    from services.embedding_cache.tier import CacheTier

    rng = np.random.default_rng(0)
    rows = torch.from_numpy(rng.standard_normal((5_000, 32)).astype(np.float32))
    tiers = {d: CacheTier("device", 5_000, 32, 600, "lru", d) for d in (CUDA, CPU)}
    assert tiers[CUDA].storage.is_cuda
    for _ in range(40):
        keys = np.unique(rng.integers(0, 5_000, 256))
        answers = {}
        for device, tier in tiers.items():
            slots, hit = tier.probe(keys)
            got = tier.gather(slots[hit]).cpu()
            tier.insert(keys[~hit], rows[keys[~hit]].to(device))
            answers[device] = (hit.copy(), got)
        assert np.array_equal(answers[CUDA][0], answers[CPU][0])
        assert torch.equal(answers[CUDA][1], answers[CPU][1])
        assert torch.equal(answers[CUDA][1], rows[keys[answers[CUDA][0]]])
    assert tiers[CUDA].evictions == tiers[CPU].evictions > 0


def test_the_hierarchical_cache_on_the_gpu_returns_the_stored_rows() -> None:
    from services.embedding_cache.cache import CacheConfig, HierarchicalEmbeddingCache

    rng = np.random.default_rng(1)
    tables = {"user": rng.standard_normal((3_000, 16)).astype(np.float32),
              "item": rng.standard_normal((20_000, 16)).astype(np.float32)}  # fmt: skip
    backing = TableRows(tables)
    cache = HierarchicalEmbeddingCache(
        backing,  # type: ignore[arg-type]
        version=1,
        tables={name: len(t) for name, t in tables.items()},
        dim=16,
        config=CacheConfig(device_capacity=0.05, host_capacity=0.2, miss_policy="fetch"),
        device=CUDA,
    )
    try:
        assert cache.device_tier.storage.is_cuda
        for _ in range(30):
            ids = np.stack([rng.integers(0, 3_000, 300), rng.zipf(1.3, 300) % 20_000], axis=1)
            got = cache.lookup(ids)
            expected = np.stack([tables["user"][ids[:, 0]], tables["item"][ids[:, 1]]], axis=1)
            np.testing.assert_array_equal(got.reshape(expected.shape), expected)
        assert cache.stats["device_hits"] > 0
    finally:
        cache.close()


def test_mixed_precision_training_on_the_gpu_learns_like_full_precision_on_the_cpu() -> None:
    from pipelines.models.dlrm import DLRM
    from pipelines.training.loop import train_epochs

    generator = torch.Generator().manual_seed(2)
    sparse = torch.randint(0, 500, (4_096, 3), generator=generator)
    dense = torch.randn(4_096, 4, generator=generator)
    logit = dense[:, 0] + (sparse[:, 1] % 2).float() * 2 - 1
    labels = (torch.rand(4_096, generator=generator) < torch.sigmoid(logit)).float()

    def run(device: torch.device) -> tuple[list[float], str]:
        torch.manual_seed(3)
        model = DLRM([500, 500, 500], n_dense=4, dim=16).to(device)
        batches = [
            (
                sparse[i : i + 512].to(device),
                dense[i : i + 512].to(device),
                labels[i : i + 512].to(device),
            )
            for i in range(0, 4_096, 512)
        ]
        seen = []

        def loss_fn(s: torch.Tensor, d: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            out = model(s, d)
            seen.append(str(out.dtype))
            return torch.nn.functional.binary_cross_entropy_with_logits(out.float(), y)

        history = train_epochs(model, lambda _: batches, loss_fn, 6, 0.01, "dlrm", quiet=True)
        return [h["loss"] for h in history], seen[0]

    gpu_loss, gpu_dtype = run(CUDA)
    cpu_loss, _ = run(CPU)
    assert gpu_dtype == "torch.bfloat16", "the forward pass should run under bf16 autocast"
    assert all(np.isfinite(gpu_loss)) and gpu_loss[-1] < gpu_loss[0] * 0.9
    print(f"final loss: bf16 on cuda {gpu_loss[-1]:.4f}, fp32 on cpu {cpu_loss[-1]:.4f}")
    assert abs(gpu_loss[-1] - cpu_loss[-1]) < 0.05, (gpu_loss, cpu_loss)


def test_faiss_on_the_gpu_finds_what_exact_search_finds() -> None:
    faiss = pytest.importorskip("faiss")
    if not hasattr(faiss, "StandardGpuResources") or faiss.get_num_gpus() < 1:
        pytest.skip("the installed faiss has no GPU support (pip install faiss-gpu-cu12)")
    rng = np.random.default_rng(4)
    items = rng.standard_normal((100_000, 64)).astype(np.float32)
    queries = rng.standard_normal((500, 64)).astype(np.float32)
    exact = faiss.IndexFlatIP(64)
    exact.add(items)
    _, truth = exact.search(queries, 100)
    resources = faiss.StandardGpuResources()
    gpu = faiss.index_cpu_to_gpu(resources, 0, exact)
    _, found = gpu.search(queries, 100)
    recall = np.mean([len(set(a) & set(b)) / 100 for a, b in zip(truth, found, strict=True)])
    assert recall >= 0.99


def test_cascade_train_trains_its_models_on_the_gpu(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`cascade train` puts the two-tower, BPR-MF and DLRM on the GPU (the training loop then
    runs bf16 autocast), hands back CPU models that evaluate and export, and the two-tower
    still beats popularity."""
    import json
    from pathlib import Path

    from cli.main import main
    from pipelines.training import baselines, ranking, retrieval
    from pipelines.training.loop import model_device, train_epochs

    trained_on: dict[str, str] = {}

    def recording(model, *args, **kwargs):  # type: ignore[no-untyped-def]
        trained_on[args[4]] = model_device(model).type  # args: batches, loss, epochs, lr, name
        return train_epochs(model, *args, **kwargs)

    for module in (retrieval, baselines, ranking):
        monkeypatch.setattr(module, "train_epochs", recording)
    small = ["--dataset", "synthetic", "--users", "300", "--items", "400"]
    small += ["--interactions", "15000", "--two-tower-epochs", "3", "--bpr-epochs", "2"]
    small += ["--dlrm-epochs", "2", "--gbm-rounds", "20"]
    work, out = tmp_path / "work", tmp_path / "out"
    assert main(["train", "--workdir", str(work), "--output", str(out), *small]) == 0
    assert trained_on == {"two-tower": "cuda", "bpr-mf": "cuda", "dlrm": "cuda"}
    report = json.loads(Path(work / "report" / "report.json").read_text())
    assert all(check["passed"] for check in report["quality_checks"]), report["quality_checks"]
    assert (out / "releases" / "1" / "manifest.json").is_file()
