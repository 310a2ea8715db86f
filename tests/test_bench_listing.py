"""The pickers' benchmark builds the store it describes and measures every call it names."""

from __future__ import annotations

from pathlib import Path

from bench.listing import build_store, measure


def test_the_listing_benchmark_builds_its_shapes_and_measures_each_call(tmp_path: Path) -> None:
    path = tmp_path / "listing.db"
    shapes = build_store(path, 80, seed=3)
    assert shapes["sessions"] == 80 and shapes["continuation"] > 0 and shapes["root"] > 0
    results = measure(path, repeats=1)
    assert results and all(isinstance(r, dict) and r["median_ms"] >= 0 for r in results.values())
