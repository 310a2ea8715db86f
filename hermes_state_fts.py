"""The three FTS5 indexes over ``messages``: CJK index text, damage handling and rebuilds.

The indexes are derived; ``sessions`` and ``messages`` are the record.

* CJK text (``search_cjk``) is spelled in Python as bigrams (``東京都`` → ``東京 京都 都``).
  The plain ``unicode61`` tokenizer then suffices, so any ``sqlite3`` shell can run the
  triggers.
* Proven index damage (:func:`damage_is_fts_only`) detaches the index (:func:`detach_index`).
  Writes go on; searches fall back to LIKE.
* A rebuild runs in keyset chunks under the admission lock. High-water and progress marks gate
  the triggers, so no row is indexed twice or missed while others write.

See docs/search.md."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import logging
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hermes_state_fulltext as fulltext
import hermes_state_lockowners as lockowners
from hermes_state_arguments import INT64_MAX, INT64_MIN
from hermes_state_bm25 import TEXT_BYTES_SQL, ColumnValue, fts5_text
from hermes_state_schema_sql import FTS_SQL, FTS_TRIGGER_NAMES, FTS_TRIGGERS_SQL, TABLES_SQL
from hermes_state_schema_sql import FTS_TRIGGERS_SQL_WITHOUT_TRIGRAM, FTS_UPDATE_OF
from hermes_state_common import OnStore, quote_identifier
from hermes_state_connect import set_meta, split_sql, table_exists
from hermes_state_errors import FtsCorruptError, is_corruption_error, is_fts_corruption_code
from hermes_state_errors import is_sqlite_lock_error

logger = logging.getLogger("hermes_state")

__all__ = [
    "FTS_TRIGGER_NAMES",
    "CJK_CHAR_CLASS",
    "cjk_index_text",
    "cjk_bigrams",
    "has_cjk",
    "contains_cjk",
    "FTS_TABLES",
    "HIGH_WATER_KEY",
    "PROGRESS_KEY",
    "STALE_KEY",
    "TRIGRAM_STALE_KEY",
    "IndexState",
    "detach_trigram",
    "earlier_update_trigger",
    "trigram_fed",
    "admission_lock",
    "admission_lock_path",
    "remove_admission_lock",
    "damage_is_fts_only",
    "damaged_canonical_tables",
    "damaged_shadow_tables",
    "detach_index",
    "empty_index",
    "index_state",
    "integrity_report",
    "iter_cjk_runs",
    "missing_triggers",
    "replace_earlier_update_trigger",
    "optimize_indexes",
    "other_processes_hold",
    "RebuildStep",
    "rebuild_chunk",
    "rebuild_when_admitted",
    "CHUNK_END_SQL",
    "next_chunk_start",
    "CJK_SPELLING",
    "SPELLING_KEY",
    "respell_due",
    "respell_chunk",
    "respell_when_admitted",
    "run_chunks",
    "restore_missing_indexes",
    "start_rebuild",
    "status",
    "RESPELL_CHUNK_ROWS",
]

# Letters of the scripts written without spaces between words (plus Hangul, which is written
# with spaces but whose syllable blocks users search for in fragments). Punctuation in these
# blocks (、。・「」 and the like) is deliberately absent: it separates runs.
CJK_CHAR_CLASS = (
    "\u1100-\u11ff"  # Hangul Jamo
    "\u3005-\u3007"  # 々 〆 〇
    "\u3041-\u309f"  # Hiragana
    "\u30a1-\u30fa\u30fc-\u30ff"  # Katakana (without ・)
    "\u3105-\u312f"  # Bopomofo
    "\u3131-\u318e"  # Hangul Compatibility Jamo
    "\u31f0-\u31ff"  # Katakana Phonetic Extensions
    "\u3400-\u4dbf"  # CJK Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\ua960-\ua97f"  # Hangul Jamo Extended-A
    "\uac00-\ud7a3"  # Hangul Syllables
    "\ud7b0-\ud7ff"  # Hangul Jamo Extended-B
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\uff66-\uff9f"  # Halfwidth Katakana
    "\U00020000-\U0003134f"  # CJK Extensions B–G
)
_CJK_RUN_RE = re.compile(f"[{CJK_CHAR_CLASS}]+")


def has_cjk(text: str | None) -> bool:
    return text is not None and not text.isascii() and _CJK_RUN_RE.search(text) is not None


# The previous SessionDB's test for CJK text (``SessionDB._contains_cjk``): its seven blocks,
# CJK punctuation included. The index uses CJK_CHAR_CLASS above; this answers callers only.
_CALLERS_CJK_RE = re.compile(
    "[\u4e00-\u9fff\u3400-\u4dbf\U00020000-\U0002a6df\u3000-\u303f\u3040-\u309f"
    "\u30a0-\u30ff\uac00-\ud7af]"
)


def contains_cjk(text: str) -> bool:
    """True when any character of ``text`` lies in U+4E00–9FFF, U+3400–4DBF, U+20000–2A6DF,
    U+3000–303F, U+3040–309F, U+30A0–30FF or U+AC00–D7AF."""
    return _CALLERS_CJK_RE.search(text) is not None


def cjk_bigrams(run: str) -> list[str]:
    """The overlapping bigrams of a CJK run; a single character is its own token."""
    if len(run) < 2:
        return [run]
    return [run[i : i + 2] for i in range(len(run) - 1)]


def _index_tokens(run: str) -> str:
    if len(run) < 2:
        return run
    return " ".join(cjk_bigrams(run)) + " " + run[-1]


def cjk_index_text(
    content: ColumnValue, tool_name: ColumnValue, tool_calls: ColumnValue
) -> str | None:
    """A row's ``search_cjk`` (None: no CJK text): its content, tool name and tool calls, the
    text ``messages_fts`` reads, one part per line (the spelling :data:`CJK_SPELLING`). The
    library writes text; a blob another client stored is read as FTS5 reads it."""
    parts = map(fts5_text, (content, tool_name, tool_calls))
    text = "\n".join(p for p in parts if p)
    if not has_cjk(text):
        return None
    return _CJK_RUN_RE.sub(lambda m: f" {_index_tokens(m.group(0))} ", text)


def iter_cjk_runs(text: str) -> Iterator[re.Match[str]]:
    return _CJK_RUN_RE.finditer(text)


# --- markers ---------------------------------------------------------------------------------

FTS_TABLES = ("messages_fts", "messages_fts_trigram", "messages_fts_cjk")
# The shadow tables FTS5 keeps for each of them (external content: no %_content).
_SHADOW_SUFFIXES = ("_data", "_idx", "_docsize", "_config")
STALE_KEY = "fts_stale"
# Set while the sync triggers feed the two other indexes only, by a handle whose SQLite has no
# trigram tokenizer (see hermes_state_fulltext): the trigram index misses rows until a rebuild.
TRIGRAM_STALE_KEY = "fts_trigram_stale"
HIGH_WATER_KEY = "fts_rebuild_high_water"
PROGRESS_KEY = "fts_rebuild_progress"
REBUILD_CHUNK_ROWS = 2000

# Canonical tables, checked to tell FTS-only damage from damage to the record itself.
_CANONICAL_TABLES = ("sessions", "messages", "state_meta", "session_model_usage")


def _delete_meta(conn: sqlite3.Connection, /, *keys: str) -> None:
    conn.executemany("DELETE FROM state_meta WHERE key = ?", ((k,) for k in keys))


# One read answers "can searches trust the indexes?" (no stale marker, no rebuild under way).
INDEX_STATE_SQL = """
SELECT
    (SELECT value FROM state_meta WHERE key = 'fts_stale'),
    (SELECT value FROM state_meta WHERE key = 'fts_rebuild_high_water'),
    (SELECT value FROM state_meta WHERE key = 'fts_rebuild_progress'),
    (SELECT value FROM state_meta WHERE key = 'fts_trigram_stale')
"""


@dataclass(frozen=True)
class IndexState:
    stale: str | None
    high_water: int | None
    progress: int | None
    trigram_stale: str | None = None  # the trigram index only (see TRIGRAM_STALE_KEY)

    @property
    def usable(self) -> bool:
        return self.stale is None and self.high_water is None

    @property
    def rebuilding(self) -> bool:
        return self.high_water is not None


def index_state(conn: sqlite3.Connection, /) -> IndexState:
    stale, high_water, progress, trigram_stale = conn.execute(INDEX_STATE_SQL).fetchone()
    return IndexState(
        stale,
        None if high_water is None else int(high_water),
        None if progress is None else int(progress),
        trigram_stale,
    )


def status(conn: sqlite3.Connection, /) -> dict[str, Any]:
    """The FTS markers and trigger set, without checking the index contents; with
    ``trigram_stale`` only while that marker is set."""
    state = index_state(conn)
    found: dict[str, Any] = {
        "stale": state.stale,
        "rebuild_high_water": state.high_water,
        "rebuild_progress": state.progress,
        "missing_triggers": missing_triggers(conn),
    }
    if state.trigram_stale is not None:
        found["trigram_stale"] = state.trigram_stale
    return found


def optimize_indexes(conn: sqlite3.Connection, /) -> int:
    """Merge the segments of each index that exists (FTS5 ``optimize``, in the caller's
    transaction); returns how many were merged. A stale or rebuilding index is left to its
    rebuild (0): merging it would only rewrite what the rebuild replaces; so is every index
    of a handle without FTS5 (0), and the trigram index of one without the trigram tokenizer
    or while that index alone is stale (see hermes_state_fulltext)."""
    level = fulltext.level_of(conn)
    state = index_state(conn)
    if level == fulltext.NONE or not state.usable:
        return 0
    skip_trigram = level != fulltext.FULL or state.trigram_stale is not None
    merged = 0
    for table in FTS_TABLES:
        if skip_trigram and table == "messages_fts_trigram":
            continue
        if table_exists(conn, table):
            conn.execute(f"INSERT INTO {table}({table}) VALUES ('optimize')")
            merged += 1
    return merged


UPDATE_TRIGGER_SQL = """
SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = 'messages_fts_update'
"""


def earlier_update_trigger(conn: sqlite3.Connection, /) -> str | None:
    """The text of an update trigger an earlier release installed (one that does not watch a
    row's ``id``, so a row another client gives a new id stayed in the indexes under its
    old one), or None."""
    row = conn.execute(UPDATE_TRIGGER_SQL).fetchone()
    if row is None or FTS_UPDATE_OF in " ".join(str(row[0]).split()):
        return None
    return str(row[0])


def replace_earlier_update_trigger(conn: sqlite3.Connection, /) -> None:
    """Replace an earlier update trigger by the declared one that feeds the same indexes (the
    caller's transaction; nothing when the trigger is current or dropped)."""
    earlier = earlier_update_trigger(conn)
    if earlier is None:
        return
    conn.execute("DROP TRIGGER messages_fts_update")
    feeds_trigram = "messages_fts_trigram" in earlier
    script = FTS_TRIGGERS_SQL if feeds_trigram else FTS_TRIGGERS_SQL_WITHOUT_TRIGRAM
    for statement in split_sql(script):  # IF NOT EXISTS: only the update trigger is new
        conn.execute(statement)


def missing_triggers(conn: sqlite3.Connection, /) -> list[str]:
    present = {
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'"
        )
    }
    return [name for name in FTS_TRIGGER_NAMES if name not in present]


# --- damage ----------------------------------------------------------------------------------


def _table_ok(conn: sqlite3.Connection, /, table: str) -> bool:
    """``quick_check`` of one table's b-trees; a table too damaged to be checked is not ok."""
    try:
        rows = conn.execute(f"PRAGMA quick_check({quote_identifier(table)})").fetchall()
    except sqlite3.Error as exc:
        if is_corruption_error(exc):
            return False
        raise
    return [r[0] for r in rows] == ["ok"]


def _fts_shadow_tables(conn: sqlite3.Connection, /) -> list[str]:
    names = [table + suffix for table in FTS_TABLES for suffix in _SHADOW_SUFFIXES]
    return [name for name in names if table_exists(conn, name)]


def damaged_shadow_tables(conn: sqlite3.Connection, /) -> list[str]:
    """The FTS shadow tables whose b-trees fail ``quick_check``."""
    return [name for name in _fts_shadow_tables(conn) if not _table_ok(conn, name)]


def damaged_canonical_tables(conn: sqlite3.Connection, /) -> list[str]:
    """The canonical tables (the record, not an index) whose b-trees fail ``quick_check``."""
    return [t for t in _CANONICAL_TABLES if table_exists(conn, t) and not _table_ok(conn, t)]


def damage_is_fts_only(conn: sqlite3.Connection, /, exc: BaseException) -> bool:
    """True when corruption reported by ``exc`` provably lies in the FTS indexes only.

    Every canonical table must pass ``quick_check``: FTS5 reads ``messages`` (its external
    content), so damage there can surface as an FTS5 error too, even as
    ``SQLITE_CORRUPT_VTAB`` (an indexed row that the damaged table no longer yields). Then
    either the result code says FTS5 found its own structures inconsistent
    (``SQLITE_CORRUPT_VTAB``), or a plain ``SQLITE_CORRUPT`` came from a b-tree of an FTS
    shadow table, which fails ``quick_check``. Anything else — including a check that cannot
    even run — is not provably FTS-only.
    """
    if isinstance(exc, MemoryError):
        return _garbage_in_index(conn)
    if not is_corruption_error(exc):
        return False
    try:
        if damaged_canonical_tables(conn):
            return False
        return is_fts_corruption_code(exc) or bool(damaged_shadow_tables(conn))
    except sqlite3.Error:
        return False


def _garbage_in_index(conn: sqlite3.Connection, /) -> bool:
    """After SQLITE_NOMEM (Python's MemoryError): True when the canonical tables are sound and
    an index fails FTS5's check of its own structures. Garbage inside an index's blobs passes
    ``quick_check`` (the b-trees are fine) but can make FTS5 try to allocate absurd sizes;
    a real shortage of memory leaves the structure checks passing and is raised as it is."""
    try:
        if damaged_canonical_tables(conn):
            return False
    except (sqlite3.Error, MemoryError):
        return False
    for table in FTS_TABLES:
        try:
            conn.execute(f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', 0)")
        except MemoryError:
            return True
        except sqlite3.Error as exc:
            if not is_sqlite_lock_error(exc):
                return True
    return False


def detach_index(conn: sqlite3.Connection, /, reason: str = "corrupt") -> None:
    """Mark the indexes stale and drop their sync triggers (the caller's transaction).

    Canonical writes then proceed without touching the damaged index; searches fall back to
    LIKE over canonical rows until a rebuild. This never rebuilds anything itself.
    """
    set_meta(conn, STALE_KEY, json.dumps({"reason": reason, "at": time.time()}))
    _delete_meta(conn, HIGH_WATER_KEY, PROGRESS_KEY)
    for name in FTS_TRIGGER_NAMES:
        conn.execute(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}")


# Sync triggers that feed the trigram index.
TRIGRAM_TRIGGERS_SQL = """
SELECT count(*) FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'messages'
  AND sql LIKE '%messages\\_fts\\_trigram%' ESCAPE '\\'
"""


def trigram_fed(conn: sqlite3.Connection, /) -> bool:
    """Whether the trigram index is fed, or read as whole: a sync trigger feeds it, or no
    marker says it (or the whole index) is stale."""
    if conn.execute(TRIGRAM_TRIGGERS_SQL).fetchone()[0]:
        return True
    state = index_state(conn)
    return state.stale is None and state.trigram_stale is None


def detach_trigram(conn: sqlite3.Connection, /, reason: str) -> None:
    """Let the sync triggers feed the two other indexes only, and mark the trigram index stale
    (the caller's transaction): what a handle whose SQLite has no trigram tokenizer needs to
    write rows. Triggers already dropped (a detached index) stay dropped. Never rebuilds."""
    if conn.execute(TRIGRAM_TRIGGERS_SQL).fetchone()[0]:
        for name in FTS_TRIGGER_NAMES:
            conn.execute(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}")
        for statement in split_sql(FTS_TRIGGERS_SQL_WITHOUT_TRIGRAM):
            conn.execute(statement)
    set_meta(conn, TRIGRAM_STALE_KEY, json.dumps({"reason": reason, "at": time.time()}))


# --- rebuild ---------------------------------------------------------------------------------


@functools.cache
def _fresh_shadow_rows() -> dict[str, tuple[tuple[object, ...], ...]]:
    """What each shadow table of a just-created, empty index holds, as this SQLite writes it
    (made once, in memory, from the same DDL)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.executescript(TABLES_SQL + FTS_SQL)
        return {
            table + suffix: tuple(conn.execute(f"SELECT * FROM {table}{suffix}").fetchall())
            for table in FTS_TABLES
            for suffix in _SHADOW_SUFFIXES
        }
    finally:
        conn.close()


def _reset_shadow_tables(conn: sqlite3.Connection, /, table: str) -> None:
    """Put ``table``'s shadow tables back to the state of a new, empty index.

    FTS5 reads an index's structure record whenever it opens the table, so once that record
    is damaged nothing that goes through the table works, 'delete-all' and even DROP TABLE
    included. The shadow tables are ordinary tables and can still be rewritten directly.
    """
    for suffix in _SHADOW_SUFFIXES:
        name = quote_identifier(table + suffix)
        conn.execute(f"DELETE FROM {name}")
        for row in _fresh_shadow_rows()[table + suffix]:
            conn.execute(f"INSERT INTO {name} VALUES ({', '.join('?' * len(row))})", row)


def empty_index(conn: sqlite3.Connection, /, table: str) -> None:
    """Empty ``table`` for a rebuild; raises :class:`FtsCorruptError` when its shadow tables
    are damaged below FTS5 (their b-trees), which only a repair of the whole file can mend.

    The shadow tables are reset first, directly: FTS5 itself never parses the old, possibly
    damaged structures (garbage there can fail any statement, even with SQLITE_NOMEM)."""
    try:
        _reset_shadow_tables(conn, table)
        conn.execute(f"INSERT INTO {table}({table}) VALUES ('delete-all')")
    except sqlite3.Error as exc:
        if is_corruption_error(exc):
            raise FtsCorruptError(
                f"{table} cannot be rebuilt in place, its tables are damaged: {exc}"
            ) from exc
        raise


def start_rebuild(conn: sqlite3.Connection, /) -> int:
    """Empty the indexes, restore the gated triggers and set the rebuild markers (the caller's
    transaction). Returns the number of rows the chunks must index (0: nothing to do).

    An index too damaged for FTS5 to open is reset from its shadow tables first; one whose
    table is gone (a handle without the trigram tokenizer made the file) is created. The
    triggers are replaced whole: a handle without the trigram tokenizer may have left ones
    that feed two indexes only."""
    _create_missing(conn)
    for table in FTS_TABLES:
        empty_index(conn, table)
    for name in FTS_TRIGGER_NAMES:
        conn.execute(f"DROP TRIGGER IF EXISTS {quote_identifier(name)}")
    for statement in split_sql(FTS_TRIGGERS_SQL):
        conn.execute(statement)
    _delete_meta(conn, STALE_KEY, TRIGRAM_STALE_KEY)
    set_meta(conn, SPELLING_KEY, CJK_SPELLING)  # the chunks respell every row they index
    high_water, rows = conn.execute(REBUILD_EXTENT_SQL).fetchone()
    _delete_meta(conn, PROGRESS_KEY, RESPELL_PROGRESS_KEY)  # no row done yet
    if rows:
        set_meta(conn, HIGH_WATER_KEY, high_water)
    else:
        _delete_meta(conn, HIGH_WATER_KEY)
    return int(rows)


def restore_missing_indexes(conn: sqlite3.Connection, /) -> bool:
    """Create again an index whose schema row is gone (a repair that could not drop a damaged
    one, a hand edit), with its rebuild due; the caller's transaction. Shadow tables it left
    behind are dropped first: FTS5 refuses to create a table over them. True when any was."""
    missing = _create_missing(conn)
    if missing:
        start_rebuild(conn)
    return bool(missing)


def _create_missing(conn: sqlite3.Connection, /) -> list[str]:
    """Create each index whose table is gone, empty (see :func:`restore_missing_indexes`)."""
    missing = [table for table in FTS_TABLES if not table_exists(conn, table)]
    for table in missing:
        for suffix in _SHADOW_SUFFIXES:
            conn.execute(f"DROP TABLE IF EXISTS {quote_identifier(table + suffix)}")
    if missing:
        for statement in split_sql(FTS_SQL):
            conn.execute(statement)
    return missing


# What a rebuild starting now must index: everything up to the highest id, and how many rows.
REBUILD_EXTENT_SQL = "SELECT COALESCE(MAX(id), 0), COUNT(*) FROM messages"
# The end of the next chunk: the id of the n-th existing row from the chunk's first id, or of
# the last one below the high water when fewer are left (a seek and n steps along the rowids).
CHUNK_END_SQL = """
SELECT MAX(id), COUNT(*) FROM (
    SELECT id FROM messages WHERE id >= ? AND id <= ? ORDER BY id LIMIT ?
)
"""
REBUILD_ROWS_SQL = f"""
SELECT m.id, {TEXT_BYTES_SQL}, m.search_cjk FROM messages m WHERE m.id >= ? AND m.id <= ?
"""
REBUILD_FTS_SQL = """
INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
    SELECT id, content, tool_name, tool_calls FROM messages WHERE id >= :lo AND id <= :hi;
INSERT INTO messages_fts_trigram(rowid, content)
    SELECT id, content FROM messages_fts_trigram_source WHERE id >= :lo AND id <= :hi;
INSERT INTO messages_fts_cjk(rowid, search_cjk)
    SELECT id, search_cjk FROM messages_fts_cjk_source WHERE id >= :lo AND id <= :hi;
"""


def next_chunk_start(progress: int | None) -> int:
    """The first id of a chunk after ``progress``, the last id done (None: none yet, so the
    chunk starts at the smallest 64-bit id: rows another client wrote at or below id 0 are
    indexed too)."""
    return INT64_MIN if progress is None else progress + 1


@dataclass(frozen=True)
class RebuildStep:
    """What one chunk of a rebuild did: the rows it indexed, and whether it was the last."""

    indexed: int
    finished: bool


def rebuild_chunk(
    conn: sqlite3.Connection, /, chunk_rows: int | None = None
) -> RebuildStep | None:
    """Index the next chunk of a rebuild (the caller's transaction): the next ``chunk_rows``
    (default :data:`REBUILD_CHUNK_ROWS`) existing rows above the progress marker.

    Returns what it did, or None when no rebuild is under way. The chunk is bounded by row
    ids that exist, so its cost is its rows, wherever they sit in the id space. Every row in
    (progress, high water] is the rebuild's (the triggers leave it alone), so a row written
    there by another process before this chunk runs is indexed by it, once. ``search_cjk`` is
    recomputed on the way, so rows written without it (by another SQLite client, or before CJK
    indexing existed) become searchable too.
    """
    state = index_state(conn)
    if state.high_water is None:
        return None
    want = REBUILD_CHUNK_ROWS if chunk_rows is None else chunk_rows
    lo = next_chunk_start(state.progress)
    last, rows = conn.execute(CHUNK_END_SQL, (lo, state.high_water, want)).fetchone()
    finished = rows < want or last == state.high_water
    hi = state.high_water if finished else last
    _respell(conn, REBUILD_ROWS_SQL, (lo, hi))
    for statement in split_sql(REBUILD_FTS_SQL):
        conn.execute(statement, {"lo": lo, "hi": hi})
    if finished:
        _delete_meta(conn, HIGH_WATER_KEY, PROGRESS_KEY)
    else:
        set_meta(conn, PROGRESS_KEY, hi)
    return RebuildStep(rows, finished)


def _respell(conn: sqlite3.Connection, sql: str, args: tuple[int, int]) -> None:
    """Store the current ``search_cjk`` of the rows ``sql`` reads (id, content, tool name,
    tool calls, stored value) where it differs; the sync trigger reindexes each such row."""
    stale = [
        (fresh, row_id)
        for row_id, content, tool_name, tool_calls, stored in conn.execute(sql, args)
        if (fresh := cjk_index_text(content, tool_name, tool_calls)) != stored
    ]
    conn.executemany("UPDATE messages SET search_cjk = ? WHERE id = ?", stale)


# --- respelling -------------------------------------------------------------------------------

# How search_cjk spells a row, recorded in state_meta for the whole file: "2" reads the tool
# name as well as the content and the tool calls. No record is the first spelling, without
# the tool name, which an earlier version wrote: such a file's rows are respelled in chunks,
# once, in the background (a rebuild respells every row on its way, and a new file has none).
CJK_SPELLING = "2"
SPELLING_KEY = "search_cjk_spelling"
# The last id respelled; a chunk is the next RESPELL_CHUNK_ROWS existing rows.
RESPELL_PROGRESS_KEY = "search_cjk_respell_progress"
RESPELL_CHUNK_ROWS = 2000
RESPELL_STATE_SQL = """
SELECT
    (SELECT value FROM state_meta WHERE key = 'search_cjk_spelling'),
    (SELECT value FROM state_meta WHERE key = 'search_cjk_respell_progress')
"""
# Only a row with a tool name is spelled differently now.
RESPELL_ROWS_SQL = f"""
SELECT m.id, {TEXT_BYTES_SQL}, m.search_cjk FROM messages m
WHERE m.id >= ? AND m.id <= ? AND m.tool_name IS NOT NULL
"""


def _last_id(value: object) -> int | None:
    """A progress marker's id; None (start over) for one another client made unreadable."""
    try:
        return None if value is None else int(str(value))
    except ValueError:
        return None


def respell_due(conn: sqlite3.Connection, /) -> bool:
    """True when rows of this file may still have an earlier spelling of ``search_cjk``."""
    return bool(conn.execute(RESPELL_STATE_SQL).fetchone()[0] != CJK_SPELLING)


def respell_chunk(
    conn: sqlite3.Connection, /, chunk_rows: int | None = None
) -> RebuildStep | None:
    """Respell the next ``chunk_rows`` (default :data:`RESPELL_CHUNK_ROWS`) existing rows of
    a file whose ``search_cjk`` has an earlier spelling (the caller's transaction); None when
    none is due, or while the indexes are stale or rebuilding (a rebuild respells). Rows
    written meanwhile by this version are spelled already and stay as they are."""
    spelling, progress = conn.execute(RESPELL_STATE_SQL).fetchone()
    if spelling == CJK_SPELLING or not index_state(conn).usable:
        return None
    want = RESPELL_CHUNK_ROWS if chunk_rows is None else chunk_rows
    lo = next_chunk_start(_last_id(progress))
    last, rows = conn.execute(CHUNK_END_SQL, (lo, INT64_MAX, want)).fetchone()
    finished = rows < want or last == INT64_MAX
    _respell(conn, RESPELL_ROWS_SQL, (lo, INT64_MAX if finished else last))
    if finished:
        _delete_meta(conn, RESPELL_PROGRESS_KEY)
        set_meta(conn, SPELLING_KEY, CJK_SPELLING)
    else:
        set_meta(conn, RESPELL_PROGRESS_KEY, last)
    return RebuildStep(rows, finished)


def respell_when_admitted(
    db_path: Path,
    read: OnStore,
    write: OnStore,
    stop: threading.Event,
    *,
    before: Callable[[], None],
) -> bool:
    """Respell the file's rows in chunks (see :func:`respell_chunk`) if this process gets the
    admission lock; True when none is left with an earlier spelling, or they are left to a
    rebuild. ``read``, ``write``, ``stop`` and ``before`` as for
    :func:`rebuild_when_admitted`."""
    with admission_lock(db_path) as admitted:
        if not admitted or not read(index_state).usable:
            return False
        if not read(respell_due):
            return True
        before()
        return run_chunks(write, respell_chunk, stop)


def run_chunks(
    write: OnStore,
    chunk: Callable[[sqlite3.Connection], RebuildStep | None],
    stop: threading.Event,
) -> bool:
    """Run ``chunk`` in write transactions until it is done (True) or ``stop`` is set."""
    while not stop.is_set():
        step = write(chunk)
        if step is None or step.finished:
            return True
    return False


def integrity_report(
    conn: sqlite3.Connection, /, *, against_content: bool = True
) -> dict[str, str | None]:
    """FTS5 'integrity-check' of each index against its content (None: clean, else the error).
    ``against_content=False`` checks the index structures only (a third of the time): enough
    for an index just built from the very rows it would be compared with.

    ``PRAGMA integrity_check`` does not look inside FTS5 structures on this SQLite, so this is
    the only check that sees a damaged index. SQLite treats the command as a write; run it
    outside a transaction, each check in its own: once a check has met a damaged b-tree,
    SQLite fails every later statement of the same transaction, its COMMIT included.
    Lock errors are raised, for the caller to retry. A trigram index that a handle without
    the trigram tokenizer left out of a new file is left out. A handle without full FTS5 raises
    :class:`~hermes_state_errors.FullTextUnavailableError`: it cannot open the indexes.
    """
    level = fulltext.level_of(conn)
    if level != fulltext.FULL:
        raise fulltext.unavailable(level, "FTS integrity check")
    report: dict[str, str | None] = {}
    # A trigram index marked stale may not even exist (a handle without the trigram
    # tokenizer made the file): it is left out, not reported damaged.
    left_out = ("messages_fts_trigram",) if index_state(conn).trigram_stale is not None else ()
    for table in FTS_TABLES:
        if table in left_out and not table_exists(conn, table):
            continue
        try:
            conn.execute(
                f"INSERT INTO {table}({table}, rank) VALUES ('integrity-check', ?)",
                (int(against_content),),
            )
            report[table] = None
        except sqlite3.Error as exc:
            if is_sqlite_lock_error(exc):
                raise
            report[table] = f"{type(exc).__name__}: {exc}"
    return report


# --- admission -------------------------------------------------------------------------------


def admission_lock_path(db_path: Path) -> Path:
    """The admission lock's file: ``<db>.lock`` beside the database."""
    return db_path.with_name(db_path.name + ".lock")


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (a lock file removed meanwhile by
    :func:`remove_admission_lock` does not)."""
    try:
        named = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)


@contextlib.contextmanager
def admission_lock(db_path: Path) -> Iterator[bool]:
    """The cross-process lock for index rebuilds (``<db>.lock``, flock, never waited for).

    Yields True when this process holds it. The lock file is not a database file, so opening
    and closing it cannot drop SQLite's POSIX locks. The lock counts only on the file the path
    names once it is taken: a file :func:`remove_admission_lock` unlinked meanwhile is let go
    and the path opened again.
    """
    lock_path = admission_lock_path(db_path)
    for _ in range(3):
        try:
            fd = os.open(
                lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600
            )
        except OSError:
            yield False
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                yield False
                return
            if not _same_file(fd, lock_path):
                continue  # removed while this process opened it: open it again
            yield True
            return
        finally:
            os.close(fd)
    yield False


def remove_admission_lock(db_path: Path) -> bool:
    """Remove the admission lock's file unless a process holds the lock; whether it is gone.
    Safe against a process that opened the file just before: once it has the lock it finds
    the path no longer names its file (see :func:`admission_lock`)."""
    with admission_lock(db_path) as admitted:
        if admitted:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(admission_lock_path(db_path))
    return admitted


def rebuild_when_admitted(
    db_path: Path,
    read: OnStore,
    write: OnStore,
    stop: threading.Event,
    *,
    require_exclusive: bool,
    before: Callable[[], None],
) -> bool:
    """Run (or finish) a chunked rebuild if this process gets the admission lock; True when
    the indexes are whole again. ``read``/``write`` run a function on the store (the latter in
    a retried write transaction), ``before`` vets the file first (it raises to refuse), and
    ``stop`` ends the chunk loop between two chunks. A detached index is only started again
    with ``require_exclusive`` when no other process has the database open."""
    with admission_lock(db_path) as admitted:
        if not admitted:
            return False
        before()
        state = read(index_state)
        if state.stale is not None or not state.rebuilding:
            if require_exclusive and other_processes_hold(db_path):
                logger.warning(
                    "FTS index of %s stays detached: other processes have it open", db_path
                )
                return False
            write(start_rebuild)
        return run_chunks(write, rebuild_chunk, stop)


def other_processes_hold(db_path: Path) -> bool:
    """True unless it is provable that no other process has the database open.

    Every WAL connection holds a shared lock on the ``-shm`` dead-man byte while it is open, so
    ``/proc/locks`` shows every other process using the file. Where ``/proc/locks`` cannot be
    read nothing is provable, and the answer is True.
    """
    if not Path(lockowners.lock_table_path()).exists():
        return True
    return bool(lockowners.lock_holders(db_path))
