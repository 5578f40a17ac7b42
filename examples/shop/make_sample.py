"""Writes the shop sample data set (``examples/shop``): a small online shop's event log,
item and customer tables, in a foreign format with string ids.

Deterministic: ``python examples/shop/make_sample.py`` rewrites the committed files byte for
byte (``--output DIR`` writes them elsewhere). The events come from the synthetic generator's
latent preference model (``pipelines/data/synthetic.py``): its well-liked picks become
clicks, add-to-carts and purchases, its poorly-rated picks and extra popularity-only browsing
become views. Brands, tags, prices and customer segments are read off the same latent
factors, so the features carry signal too, and a few new items with no event at all are the
cold-start items. See docs/your-data.md.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import hashlib
import io
import json
from pathlib import Path

import numpy as np

from pipelines.data.synthetic import make_synthetic

HERE = Path(__file__).resolve().parent
SEED = 33
CUSTOMERS, PRODUCTS, PICKS = 1_500, 720, 48_000
NEW_PRODUCTS = 40  # in items.csv, in no event: the cold-start items
BROWSING = 0.35  # extra popularity-only views, as a share of PICKS
STRENGTH = 3.0  # how strongly the latent affinity drives the picks (synthetic's default: 2)
START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPAN_MS = 90 * 86_400_000

BRANDS = (
    "Acme",
    "Nordlys",
    "Müller & Söhne",
    "Ærø Design",
    "Šimek",
    "東京堂",
    "Brightline",
    "Café Olé",
    "Kestrel",
    "Oakridge",
    "Zéphyr",
    "Pinecone Co.",
    "Лиса",
    "Vantage",
    "Łódź Works",
    "Meridian",
)
TAGS = ("outdoor", "kitchen", "kids", "eco", "premium", "gift", "tech", "sport")
COLOURS = ("BLK", "WHT", "RED", "BLU", "GRN", "GRÜN", "ROSÉ", "灰")
COUNTRIES = ("DE", "FR", "GB", "NL", "PL", "SE", "ES", "IT", "JP", "US")
SEGMENTS = ("bargain", "loyal", "new-parent", "gadget-fan", "green", "runner")
PRICES = np.asarray([4.99, 9.99, 14.99, 19.99, 29.99, 49.99, 79.99, 129.0, 249.0, 499.0])
ACTIONS = np.asarray(["view", "click", "add_to_cart", "purchase"])


def _hex(prefix: str, index: int, length: int) -> str:
    return hashlib.sha1(f"{prefix}{index}".encode()).hexdigest()[:length]


def customer_ids(n: int) -> list[str]:
    """Opaque customer ids; every 150th a long e-mail-like id (about 70 characters)."""
    ids = []
    for i in range(n):
        if i % 150 == 149:
            ids.append(f"customer:{_hex('u', i, 32)}@accounts.shop.example")
        else:
            ids.append(f"cu_{_hex('u', i, 10)}")
    return ids


def skus(n: int, rng: np.random.Generator) -> list[str]:
    """SKUs like ``SKU-00042-BLK`` (some colour codes in unicode); every 100th a long slug."""
    colours = rng.integers(0, len(COLOURS), n)
    out = []
    for i in range(n):
        sku = f"SKU-{i + 1:05d}-{COLOURS[colours[i]]}"
        if i % 100 == 99:
            slug = "-".join(["extra-long-product-slug-with-every-variant-attribute"] * 3)
            sku = f"{sku}-{slug}-{_hex('i', i, 12)}"  # about 190 characters
        out.append(sku)
    return out


def _labels(factors: np.ndarray, names: tuple[str, ...], rng: np.random.Generator) -> np.ndarray:
    """One label per row: the nearest of ``len(names)`` random directions in latent space."""
    directions = rng.normal(size=(factors.shape[1], len(names)))
    return np.asarray(names, dtype=object)[np.argmax(factors @ directions, axis=1)]


def _sets(factors: np.ndarray, names: tuple[str, ...], threshold: float, sep: str) -> list[str]:
    """Each row's names whose latent dimension is above ``threshold`` (at most three)."""
    out = []
    for row in factors[:, : len(names)]:
        top = [i for i in np.argsort(-row)[:3] if row[i] > threshold]
        out.append(sep.join(names[i] for i in sorted(top)))
    return out


def _csv(header: list[str], rows: list[list[object]]) -> bytes:
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return buffer.getvalue().encode("utf-8")


def build(seed: int = SEED) -> dict[str, bytes]:
    """The sample's files (name -> bytes)."""
    raw = make_synthetic(
        CUSTOMERS,
        PRODUCTS + NEW_PRODUCTS,
        PICKS,
        seed=seed,
        preference_strength=STRENGTH,
    )
    assert raw.truth is not None
    rng = np.random.default_rng(seed + 1)
    n_items = PRODUCTS + NEW_PRODUCTS
    user_factors, item_factors = raw.truth.user_factors, raw.truth.item_factors

    # events: the synthetic picks of items 1..PRODUCTS (the last NEW_PRODUCTS never occur)
    picks = raw.interactions[raw.interactions["item_id"] <= PRODUCTS]
    rating = picks["rating"].to_numpy()
    action = np.select([rating >= 5, rating >= 4, rating >= 3], [3, 2, 1], 0)
    counts = np.bincount(picks["item_id"].to_numpy(), minlength=n_items + 1)[1 : PRODUCTS + 1]
    n_views = int(BROWSING * PICKS)
    viewed = rng.choice(PRODUCTS, n_views, p=(counts + 1) / (counts + 1).sum()) + 1
    viewers = rng.choice(picks["user_id"].to_numpy(), n_views)
    users = np.concatenate([picks["user_id"].to_numpy(), viewers])
    items = np.concatenate([picks["item_id"].to_numpy(), viewed])
    actions = np.concatenate([action, np.zeros(n_views, np.int64)])
    stamps = START_MS + rng.integers(0, SPAN_MS, len(users))
    device = np.where(rng.random(len(users)) < 0.6, "app", "web")
    order = np.argsort(stamps, kind="stable")

    customers, products = customer_ids(CUSTOMERS), skus(n_items, rng)
    lines = [
        json.dumps(
            {
                "customer": customers[users[r] - 1],
                "sku": products[items[r] - 1],
                "action": str(ACTIONS[actions[r]]),
                "ts": int(stamps[r]),
                "device": str(device[r]),
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        for r in order
    ]
    events = gzip.compress(("\n".join(lines) + "\n").encode("utf-8"), compresslevel=9, mtime=0)

    brands = _labels(item_factors, BRANDS, rng)
    tags = _sets(item_factors, TAGS, 0.9, ";")
    price_bucket = np.clip(np.rint(2.0 * item_factors[:, -1] + 4.5), 0, len(PRICES) - 1)
    prices = PRICES[price_bucket.astype(np.int64)]
    available = rng.random(n_items) < 0.92
    item_rows: list[list[object]] = [
        [products[i], brands[i], tags[i], f"{prices[i]:.2f}", str(bool(available[i])).lower()]
        for i in range(n_items)
    ]

    countries = _labels(user_factors, COUNTRIES, rng)
    segments = _sets(user_factors, SEGMENTS, 1.0, "|")
    ages = raw.users["age"].to_numpy()
    user_rows: list[list[object]] = [
        [customers[u], countries[u], int(ages[u]), segments[u]] for u in range(CUSTOMERS)
    ]
    return {
        "events.jsonl.gz": events,
        "items.csv": _csv(["sku", "brand", "tags", "price", "available"], item_rows),
        "users.csv": _csv(["customer", "country", "age", "segments"], user_rows),
    }


def write(output: Path, seed: int = SEED) -> list[Path]:
    """Write the sample's data files into ``output`` (``dataset.yaml`` is written by hand)."""
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in build(seed).items():
        (output / name).write_bytes(data)
        written.append(output / name)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--output", type=Path, default=HERE, help="directory to write (default: %(default)s)"
    )
    args = parser.parse_args()
    for path in write(args.output):
        print(f"{path}: {path.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
