"""The append benchmark measures what it names: the same messages into two stores, one of
which keeps the search index and one which does not."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import hermes_state_impact as impact
from bench.corpus import generate_corpus
from bench.suite import append_batch, append_cpu_kept_and_stopped, postings_cpu


def test_the_append_cpu_figure_indexes_every_message_of_one_store_and_none_of_the_other(
    tmp_path: Path,
) -> None:
    batch, sessions = append_batch(list(generate_corpus(600, seed=2)), 3 * impact.FLUSH_ROWS)
    kept_us, stopped_us = append_cpu_kept_and_stopped(tmp_path, sessions, batch)
    assert kept_us > 0 and stopped_us > 0
    state = "SELECT indexed, damaged FROM search_impact_state"
    for name, expected in (("kept", (len(batch), 0)), ("stopped", (0, 1))):
        conn = sqlite3.connect(tmp_path / f"{name}.db")
        try:
            assert conn.execute("SELECT count(*) FROM messages").fetchone() == (len(batch),)
            assert conn.execute(state).fetchone() == expected, name
            postings = conn.execute("SELECT count(*) FROM search_impact").fetchone()[0]
            assert postings == (len(batch) if name == "kept" else 0)
        finally:
            conn.close()


def test_the_postings_figure_times_every_stored_message_and_is_a_part_of_an_append(
    tmp_path: Path,
) -> None:
    batch, sessions = append_batch(list(generate_corpus(600, seed=2)), 2 * impact.FLUSH_ROWS)
    kept_us, _ = append_cpu_kept_and_stopped(tmp_path, sessions, batch)
    timed: list[object] = []

    def postings(*row: Any) -> Any:
        timed.append(row)
        return impact.impact_postings(*row)

    posting_us = postings_cpu(tmp_path / "kept.db", repeats=2, postings=postings)
    assert len(timed) == 2 * len(batch)
    assert 0 < posting_us < kept_us
