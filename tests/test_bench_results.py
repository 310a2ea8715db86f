"""``python -m bench`` keeps ``bench/RESULTS.md`` current one benchmark at a time, and the
replication loss benchmark counts the acknowledged rows a crash took from the replica."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hermes_state_replication as replication
from bench.replication import loss_trial
from bench.results import write_results
from bench.suite import Figure
from hermes_state import ReplicationError


def figure(bench_id: str, name: str, ours: float) -> Figure:
    return Figure(bench_id, name, ours, 2.0, "ms", ours / 2.0, (0.4, 0.6), "report",
                  notes={"samples": 3})


def test_a_run_replaces_the_sections_it_measured_and_keeps_the_others(tmp_path: Path) -> None:
    results = tmp_path / "RESULTS.md"
    write_results([figure("B3", "search", 1.0), figure("B10", "loss", 2.0)], "first", results)
    write_results([figure("B3", "search", 5.0), figure("B2", "writers", 3.0)], "second",
                  results)
    text = results.read_text(encoding="utf-8")
    assert re.findall(r"^## (B\d+)$", text, re.MULTILINE) == ["B2", "B3", "B10"]
    b3 = text.split("## B3", 1)[1].split("\n## ", 1)[0]
    assert "`second`" in b3 and "| search | 5.00 | 2.00 | ms | 2.50 | 0.40–0.60 |" in b3
    b10 = text.split("## B10", 1)[1]
    assert "`first`" in b10 and "| loss | 2.00 |" in b10 and "samples=3" in b10
    assert "load average" in b10 and "SQLite" in b10
    assert not list(tmp_path.glob("*.tmp"))  # written whole, through a staged file


@pytest.mark.slow
def test_a_crash_under_load_loses_only_the_newest_acknowledged_rows() -> None:
    try:
        binary = replication.find_litestream()
        replication.litestream_version(binary)
    except ReplicationError as exc:
        pytest.skip(str(exc))
    trial = loss_trial(binary, "250ms", writers=2, storm_s=4.0, seed=3)
    assert trial["acked"] > 20, trial
    assert trial["lost"] < trial["acked"], trial  # the replica holds the older rows
    assert (trial["lost"] == 0) == (trial["oldest_lost_s"] == 0.0), trial
    assert 0.0 <= trial["oldest_lost_s"] < 4.0, trial
