"""Recover: salvage what a damaged session store still holds into a fresh database.

The source is never opened with SQLite, so nothing is written beside it: recover reads private
byte copies. A hot journal is rolled back and the ``-wal`` read in views, newest first. Rows
merge by rowid; where views or counts disagree, losses are reported as unknown, never zero.

Tables are read by SQL, then by walking pages (``hermes_state_fileformat``). Walking knows each
bad page's key range, which bounds the loss. Derived indexes are rebuilt. Runtime ledgers are
not copied: a partial ledger could replay started work. See docs/operations.md."""

from __future__ import annotations

import bisect
import contextlib
import datetime
import os
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hermes_state_fileformat as ff
import hermes_state_fts as fts
import hermes_state_fulltext as fulltext
import hermes_state_impact as impact
from hermes_state_common import quote_identifier
from hermes_state_connect import (
    connect,
    split_sql,
    table_exists,
    transaction,
)
from hermes_state_files import (
    journal_path,
    make_private_dir,
    prepare_db_file,
    remove_abandoned_temps,
    sidecar_paths,
    temp_prefix,
    wal_without_database,
)
from hermes_state_home import get_hermes_home
from hermes_state_schema_sql import (
    DELIVERY_OBLIGATIONS_SQL,
    RUNTIME_LEDGER_TABLES,
    SCHEMA_VERSION,
    TABLES_SQL,
)
from hermes_state_errors import (
    HermesStateError,
    StateDbInUseError,
    StateDbUnavailableError,
    foreign_database_error,
    translated_errors,
)
from hermes_state_lockowners import describe_lock_holders, lock_holders
from hermes_state_maintenance import (
    Progress,
    no_progress,
    quick_check,
    rebuild_indexes,
    utc_stamp,
)
from hermes_state_schema import (
    OLD_DELEGATION_COLUMNS,
    read_version,
    reshape_delegations,
    restore_data_invariants,
)
from hermes_state_testguard import check_test_isolation

__all__ = ["recover_state_db"]

# A recover's work copies: ``.hermes-recover-<pid>...`` beside the output (or in the system's
# temporary folder); a later recover removes those of a killed one.
RECOVER_MARK = ".hermes-recover-"


# Derived or rebuilt, never copied: the FTS indexes (and their shadow tables), the search
# index, the version row.
_REBUILT = (*fts.FTS_TABLES, *impact.INDEX_TABLES, "schema_version")
# state_meta keys that describe the old file's FTS indexes, not the recovered one's.
_FTS_MARKERS = (fts.STALE_KEY, fts.HIGH_WATER_KEY, fts.PROGRESS_KEY)
_INSERT_BATCH = 500
_COPY_ORDER = ("sessions", "messages", "session_model_usage")


def _affinity(declared: str) -> str:
    """SQLite's column affinity rules (datatype3 §3.1)."""
    decl = (declared or "").upper()
    if "INT" in decl:
        return "INTEGER"
    if any(t in decl for t in ("CHAR", "CLOB", "TEXT")):
        return "TEXT"
    if not decl or "BLOB" in decl:
        return "BLOB"
    if any(t in decl for t in ("REAL", "FLOA", "DOUB")):
        return "REAL"
    return "NUMERIC"


@dataclass
class _TableShape:
    """A table's columns as the records on disk store them."""

    name: str
    columns: list[str]
    affinities: list[str]
    required: list[bool]  # NOT NULL without a default, or the primary key
    ipk: int | None  # the INTEGER PRIMARY KEY column (stored as NULL: the rowid is the value)
    rowid: bool = True
    root: int | None = None

    @property
    def min_values(self) -> int:
        """Records never hold fewer values than the last required column (later columns are
        added with ALTER TABLE ADD COLUMN and may be missing from older records)."""
        last = [i for i, r in enumerate(self.required) if r and i != self.ipk]
        return last[-1] + 1 if last else 1

    def row(self, rowid: int, values: list[Any]) -> list[Any]:
        """Record values as SQLite would return them: the rowid in the INTEGER PRIMARY KEY
        column, REAL-affinity integers as floats."""
        out = list(values)
        if self.ipk is not None and self.ipk < len(out):
            out[self.ipk] = rowid
        for i, value in enumerate(out):
            if self.affinities[i] == "REAL" and isinstance(value, int):
                out[i] = float(value)
        return out

    def fits(self, values: list[Any]) -> bool:
        """Could this record belong to this table? (Used for pages no tree reaches.)"""
        if not self.min_values <= len(values) <= len(self.columns):
            return False
        for i, value in enumerate(values):
            if i == self.ipk:
                if value is not None:
                    return False
            elif value is None:
                if self.required[i]:
                    return False
            elif not isinstance(value, _AFFINITY_TYPES.get(self.affinities[i], object)):
                return False
        return True


# The Python types a value of each column affinity must have to fit (others take any).
_AFFINITY_TYPES: dict[str, type | tuple[type, ...]] = {
    "TEXT": str, "INTEGER": int, "REAL": (int, float),
}


def _shape_from_sql(name: str, sql: str | None) -> _TableShape | None:
    """The shape of a table from its CREATE TABLE statement, parsed by SQLite in memory."""
    if not sql or not sql.lstrip().upper().startswith("CREATE TABLE"):
        return None
    mem = sqlite3.connect(":memory:")
    try:
        mem.execute(sql)
        info = mem.execute("SELECT * FROM pragma_table_info(?)", (name,)).fetchall()
        listed = mem.execute("SELECT wr FROM pragma_table_list WHERE name = ?", (name,)).fetchone()
    except sqlite3.Error:
        return None
    finally:
        mem.close()
    if not info:
        return None
    pks = [r for r in info if r[5]]
    ipk = None
    if len(pks) == 1 and str(pks[0][2]).upper() == "INTEGER":
        ipk = pks[0][0]
    return _TableShape(
        name=name,
        columns=[r[1] for r in info],
        affinities=[_affinity(r[2]) for r in info],
        required=[bool(r[3] and r[4] is None) or bool(r[5]) for r in info],
        ipk=ipk,
        rowid=not (listed and listed[0]),
    )


def _current_shapes() -> dict[str, _TableShape]:
    """The shapes of the current schema's tables (and delivery_obligations)."""
    mem = sqlite3.connect(":memory:")
    try:
        mem.executescript(TABLES_SQL + DELIVERY_OBLIGATIONS_SQL)
        rows = mem.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'").fetchall()
    finally:
        mem.close()
    shapes = {n: _shape_from_sql(n, s) for n, s in rows if not n.startswith("sqlite_")}
    return {n: s for n, s in shapes.items() if s is not None}


@dataclass
class _ViewTally:
    """What one view of the source gave a table: rows read, rows only it holds (no newer
    view has their rowid), how many of those were copied or refused, and some of their ids."""

    read: int = 0
    only_here: int = 0
    copied: int = 0
    refused: int = 0
    ids: list[int] = field(default_factory=list)


@dataclass
class _TableReport:
    name: str
    shape: _TableShape
    found: int = 0
    copied: int = 0
    rejected: int = 0
    skipped: int = 0
    source_count: int | None = None
    method: str = "sql"
    error: str | None = None
    last_sql_rowid: int | None = None
    bad_pages: list[ff.BadPage] = field(default_factory=list)
    page_rowids: set[int] = field(default_factory=set)
    orphan_pages: int = 0
    rejections: list[str] = field(default_factory=list)
    excluded: bool = False
    unknown: bool = False
    sql: str | None = None
    views: dict[str, _ViewTally] = field(default_factory=dict)
    duplicates: int = 0
    impossible: list[int] = field(default_factory=list)
    impossible_count: int = 0

    @property
    def damaged(self) -> bool:
        return self.error is not None or bool(self.bad_pages)


# The views of a source, in the order their rows are taken: the main file with the verified
# commits of its -wal folded in, the main file alone, and (only where a damaged -wal frame's
# page is not rewritten by a later commit) the first view with the damaged frames' own,
# unverified content applied.
# Last comes the main file as the interrupted transaction left it, where a damaged rollback
# journal record could not restore a page (the other views read that page as blank).
VIEW_WAL, VIEW_FILE, VIEW_DAMAGED = "file+wal", "file", "damaged-wal-frames"
VIEW_TORN = "unrestored-journal-pages"
_VIEW_WORDS = {
    VIEW_FILE: "the main file",
    VIEW_DAMAGED: "the unverified content of damaged -wal frames",
    VIEW_TORN: "the pages a damaged rollback journal could not restore",
}


class _View:
    """One reading of the source: a private image file, the file-format reader on it and an
    SQLite connection on it (``immutable=1``: the image is private and never changes)."""

    def __init__(self, name: str, path: Path, page_size: int | None, notes: list[str]) -> None:
        self.name = name
        self.path = path
        self.notes = notes
        self.image = ff.DatabaseImage(path, page_size=page_size)
        self.sql: sqlite3.Connection | None = None
        try:
            self.sql = connect(path, "ro", immutable=True)
            self.sql.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        except sqlite3.Error as exc:
            notes.append(f"SQLite cannot open the source ({name}): {exc}")
            if self.sql is not None:
                self.sql.close()
            self.sql = None

    def close(self) -> None:
        if self.sql is not None:
            self.sql.close()
        self.image.close()


class _Source:
    """The private images of the source, never the source itself.

    The main file is copied byte for byte and a hot rollback journal rolled back on the copy,
    so what follows reads the committed state, never the uncommitted pages an interrupted
    transaction (a killed restore or repair promotion) left in the main file. When the -wal
    holds commits, a second copy gets them folded in (past a damaged frame, where later
    commits verify): that is the newest view, and the main file alone is read too, because a
    WAL written over damage can replace pages the main file still holds intact."""

    def __init__(self, source: Path, workdir: Path) -> None:
        self.notes: list[str] = []
        base = workdir / "main.db"
        self.unreadable_bytes = _copy_bytes(source, base)
        # The -wal is read from a private copy too: scanned, folded and compared as one file.
        self.wal_path = workdir / "source.db-wal"
        wal = sidecar_paths(source)[0]
        if wal.is_file():
            self.unreadable_bytes += _copy_bytes(wal, self.wal_path)
        if self.unreadable_bytes:
            self.notes.append(f"{self.unreadable_bytes} bytes of the source could not be read")
        self.journal = ff.roll_back_journal(journal_path(source), base)
        self.notes += self.journal.notes
        torn = self._set_aside_unrestored(base, workdir / "torn.db")
        scan = ff.scan_wal(self.wal_path)
        self.wal = ff.WalFold(page_size=scan.page_size, scan=scan, notes=list(scan.notes))
        self.wal_rows: dict[str, int] = {}
        self.views: list[_View] = []
        try:
            if scan.applied_frames(salvage=True):
                image = workdir / "image.db"
                shutil.copyfile(base, image)
                self.wal = ff.fold_wal(self.wal_path, image, scan=scan)
                if scan.problem:
                    self.wal_rows = ff.wal_damage_rows(base, self.wal_path, scan)
                self.views.append(_View(VIEW_WAL, image, self.wal.page_size, self.notes))
            self.notes += self.wal.notes
            self.views.append(_View(VIEW_FILE, base, self.wal.page_size, self.notes))
            if self.wal.unreplaced:
                damaged = workdir / "damaged.db"
                shutil.copyfile(base, damaged)
                ff.fold_wal(self.wal_path, damaged, unverified=True, scan=scan)
                self.views.append(_View(VIEW_DAMAGED, damaged, self.wal.page_size, self.notes))
            if torn is not None:
                self.views.append(_View(VIEW_TORN, torn, self.journal.page_size, self.notes))
        except BaseException:
            self.close()
            raise

    def _set_aside_unrestored(self, base: Path, torn: Path) -> Path | None:
        """Where damaged journal records left pages unrestored, those pages may hold the
        interrupted transaction's content: keep a copy as it is for a last view, and blank
        them in ``base`` (page 1 excepted: without it nothing reads), so that no row of
        theirs can pass for a committed one."""
        journal = self.journal
        pages = sorted({p for _, p in journal.damaged
                        if 1 < p <= (journal.initial_pages or 0)})
        if not pages or journal.page_size is None:
            return None
        shutil.copyfile(base, torn)
        fd = os.open(base, os.O_WRONLY)
        try:
            for pgno in pages:
                os.pwrite(fd, bytes(journal.page_size), (pgno - 1) * journal.page_size)
        finally:
            os.close(fd)
        return torn

    @property
    def primary(self) -> _View:
        return self.views[0]

    def close(self) -> None:
        for view in self.views:
            view.close()


def _copy_bytes(source: Path, dest: Path, chunk: int = 1 << 20) -> int:
    """Copy ``source`` byte for byte into the new private file ``dest``; ranges the disk
    cannot read (EIO) become zeros, page by page. Returns the number of unreadable bytes."""
    lost = 0
    src = os.open(source, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            size = os.fstat(src).st_size
            for offset in range(0, size, chunk):
                want = min(chunk, size - offset)
                try:
                    data = os.pread(src, want, offset)
                except OSError:
                    parts = []
                    for sub in range(offset, offset + want, 4096):
                        n = min(4096, offset + want - sub)
                        try:
                            parts.append(os.pread(src, n, sub))
                        except OSError:
                            parts.append(bytes(n))
                            lost += n
                    data = b"".join(parts)
                os.pwrite(dst, data, offset)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return lost


def _read_schema(view: _View) -> tuple[list[tuple[Any, ...]], str]:
    """sqlite_master's rows (type, name, tbl_name, rootpage, sql) and how they were read."""
    if view.sql is not None:
        try:
            rows = view.sql.execute(
                "SELECT type, name, tbl_name, rootpage, sql FROM sqlite_master"
            ).fetchall()
            return rows, "sql"
        except sqlite3.Error as exc:
            view.notes.append(f"the schema cannot be read by SQLite ({view.name}): {exc}")
    rows = ff.schema_rows(view.image)
    return rows, ("pages" if rows else "none")


@dataclass
class _Plan:
    """What to do with each table of the source."""

    copy: dict[str, _TableReport]
    excluded: dict[str, _TableReport]
    schema_method: str
    index_roots: list[int]
    table_roots: list[int]
    source_seq: dict[str, int]
    max_rowid: dict[str, int] = field(default_factory=dict)
    # The tables of another application's database, read from an intact schema (SQLite read
    # it) that names neither ``sessions`` nor ``schema_version``; empty for a session store.
    foreign: list[str] = field(default_factory=list)

    def reports(self) -> list[_TableReport]:
        return [*self.copy.values(), *self.excluded.values()]


def _max_rowids(view: _View, reports: Iterable[_TableReport]) -> dict[str, int]:
    """The largest rowid of each rowid table, where SQLite can seek it (the rightmost path)."""
    found: dict[str, int] = {}
    if view.sql is None:
        return found
    for report in reports:
        if not report.shape.rowid:
            continue
        with contextlib.suppress(sqlite3.Error):
            top = view.sql.execute(
                f"SELECT MAX(rowid) FROM {quote_identifier(report.name)}").fetchone()[0]
            if isinstance(top, int):
                found[report.name] = top
    return found


def _plan(src: _View) -> _Plan:
    """What to copy from ``src``: a report per table (to copy or excluded), the b-tree roots
    and what SQLite can still tell of the source (sequences, largest rowids)."""
    entries, method = _read_schema(src)
    current = _current_shapes()
    copy, excluded = _table_reports(entries, current)
    if method == "none":
        _look_for_every_table(current, copy, excluded)
    ordered = dict(sorted(copy.items(), key=lambda kv: (
        _COPY_ORDER.index(kv[0]) if kv[0] in _COPY_ORDER else len(_COPY_ORDER), kv[0])))
    plan = _Plan(ordered, excluded, method, _roots(entries, "index"), _roots(entries, "table"),
                 _sequences(src) if method == "sql" else {})
    plan.max_rowid = _max_rowids(src, plan.reports())
    tables = [n for t, n, *_ in entries if t == "table" and not n.startswith("sqlite_")]
    if method == "sql" and tables and not {"sessions", "schema_version"} & set(tables):
        plan.foreign = tables
    return plan


def _roots(entries: list[tuple[Any, ...]], kind: str) -> list[int]:
    """The root pages of the schema's b-trees of one kind ("table" or "index")."""
    return [root for k, _name, _tbl, root, _sql in entries
            if k == kind and isinstance(root, int) and root > 0]


def _sequences(src: _View) -> dict[str, int]:
    """The source's AUTOINCREMENT sequences, where SQLite can read them."""
    if src.sql is not None:
        with contextlib.suppress(sqlite3.Error):
            return {n: int(s) for n, s in src.sql.execute("SELECT name, seq FROM sqlite_sequence")}
    return {}


def _table_reports(
    entries: list[tuple[Any, ...]], current: Mapping[str, _TableShape]
) -> tuple[dict[str, _TableReport], dict[str, _TableReport]]:
    """The reports of the tables the schema names that recovery copies, and of those it
    excludes (the runtime ledgers); derived tables are rebuilt, not copied."""
    virtual = {n for t, n, _, _, sql in entries if t == "table" and sql
               and sql.lstrip().upper().startswith("CREATE VIRTUAL")}
    copy: dict[str, _TableReport] = {}
    excluded: dict[str, _TableReport] = {}
    for kind, name, _tbl, root, sql in entries:
        if kind != "table" or not isinstance(root, int) or _derived(name, virtual):
            continue
        shape = _shape_from_sql(name, sql) or current.get(name)
        if shape is None:
            continue
        shape.root = root if root > 0 else None
        report = _TableReport(name, shape, sql=sql)
        if name in RUNTIME_LEDGER_TABLES:
            report.excluded = True
            excluded[name] = report
        else:
            report.unknown = name not in current
            copy[name] = report
    return copy, excluded


def _derived(name: str, virtual: set[str]) -> bool:
    """Whether a table is SQLite's own, a virtual table or its shadow, or rebuilt anyway."""
    return (
        name in virtual
        or name.startswith(("sqlite_", "messages_fts"))
        or name in _REBUILT
        or any(name.startswith(v + "_") for v in virtual)
    )


def _look_for_every_table(
    current: Mapping[str, _TableShape],
    copy: dict[str, _TableReport],
    excluded: dict[str, _TableReport],
) -> None:
    """No schema at all: every current table is looked for, by shape, among all pages."""
    for name, shape in current.items():
        if name in _REBUILT:
            continue
        report = _TableReport(name, shape, method="pages", error="schema unreadable")
        (excluded if name in RUNTIME_LEDGER_TABLES else copy)[name] = report
        report.excluded = name in RUNTIME_LEDGER_TABLES


def _sql_rows(src: _View, report: _TableReport) -> Iterator[tuple[int | None, list[Any]]]:
    """The table through SQLite, until the first error (then ``report.error`` says why)."""
    if src.sql is None or report.error is not None:
        report.error = report.error or "SQLite cannot open the source"
        return
    shape = report.shape
    columns = ", ".join(quote_identifier(c) for c in shape.columns)
    rowid = "rowid, " if shape.rowid else "NULL, "
    try:
        report.source_count = src.sql.execute(
            f"SELECT COUNT(*) FROM {quote_identifier(report.name)}"
        ).fetchone()[0]
    except sqlite3.Error:
        report.source_count = None
    try:
        for row in src.sql.execute(f"SELECT {rowid}{columns} FROM {quote_identifier(report.name)}"):
            report.last_sql_rowid = row[0]
            yield row[0], list(row[1:])
    except sqlite3.Error as exc:
        report.error = f"{type(exc).__name__}: {exc}"
        report.source_count = None


def _sql_rows_not_in(
    src: _View, report: _TableReport, taken: set[int]
) -> Iterator[tuple[int | None, list[Any]]]:
    """The rows of an older view that no newer view gave: the rowids are scanned first (a
    scan that decodes no column) and only the missing rows are read whole. Where SQLite
    cannot do that, the whole table is read (and from there, page by page)."""
    if src.sql is None or report.error is not None or not report.shape.rowid:
        yield from _sql_rows(src, report)
        return
    table = quote_identifier(report.name)
    try:
        missing = [r for (r,) in src.sql.execute(f"SELECT rowid FROM {table}") if r not in taken]
    except sqlite3.Error:
        yield from _sql_rows(src, report)
        return
    columns = ", ".join(quote_identifier(c) for c in report.shape.columns)
    for start in range(0, len(missing), _INSERT_BATCH):
        chunk = missing[start : start + _INSERT_BATCH]
        try:
            rows = src.sql.execute(
                f"SELECT rowid, {columns} FROM {table} WHERE rowid IN"
                f" ({', '.join('?' * len(chunk))})", chunk).fetchall()
        except sqlite3.Error as exc:
            report.error = f"{type(exc).__name__}: {exc}"  # the page walk reads the rest
            return
        for row in rows:
            yield row[0], list(row[1:])


def _page_rows(
    src: _View, report: _TableReport, claimed: set[int]
) -> Iterator[tuple[int, list[Any]]]:
    """The rest of a table SQLite stopped reading: its b-tree walked page by page."""
    shape = report.shape
    if shape.root is None or not shape.rowid:
        return
    report.method = "sql+pages" if report.last_sql_rowid is not None else "pages"
    floor = report.last_sql_rowid
    for item in ff.walk_table(src.image, shape.root, claimed):
        if isinstance(item, ff.BadPage):
            report.bad_pages.append(item)
            continue
        if floor is not None and item.rowid <= floor:
            continue
        try:
            values = ff.decode_record(item.payload, src.image.encoding)
        except ff.PageError as exc:
            report.bad_pages.append(ff.BadPage(item.pgno, str(exc), item.rowid - 1, item.rowid, 1))
            continue
        if len(values) > len(shape.columns):
            report.bad_pages.append(
                ff.BadPage(item.pgno, "record wider than the table", item.rowid - 1, item.rowid, 1)
            )
            continue
        report.page_rowids.add(item.rowid)
        yield item.rowid, shape.row(item.rowid, values)


def _orphan_rows(
    src: _View, plan: _Plan, claimed: set[int], damaged: list[_TableReport]
) -> Iterator[tuple[_TableReport, int, list[Any]]]:
    """Rows of leaf pages no b-tree reaches, attributed to the one damaged table whose
    shape every record of the page fits; ambiguous pages are left alone."""
    candidates = [r for r in damaged if r.shape.rowid]
    if not candidates:
        return
    _claim_reachable(src.image, plan, claimed)
    for _pgno, cells, _bad in ff.iter_orphan_leaves(src.image, claimed):
        try:
            records = [(c.rowid, ff.decode_record(c.payload, src.image.encoding)) for c in cells]
        except ff.PageError:
            continue
        owner = _sole_owner(candidates, records)
        if owner is None:
            continue
        owner.orphan_pages += 1
        floor = owner.last_sql_rowid
        for rowid, values in records:
            if rowid in owner.page_rowids or (floor is not None and rowid <= floor):
                continue
            owner.page_rowids.add(rowid)
            yield owner, rowid, owner.shape.row(rowid, values)


def _sole_owner(
    candidates: list[_TableReport], records: list[tuple[int, list[Any]]]
) -> _TableReport | None:
    """The one table whose shape every record fits; None when none or several do."""
    owners = [r for r in candidates if all(r.shape.fits(v) for _, v in records)]
    return owners[0] if len(owners) == 1 else None


def _claim_reachable(image: ff.DatabaseImage, plan: _Plan, claimed: set[int]) -> None:
    """Add to ``claimed`` every page a b-tree of the plan or the freelist reaches."""
    for root in plan.index_roots:
        ff.walk_index(image, root, claimed)
    for root in plan.table_roots:
        for _ in ff.walk_table(image, root, claimed):
            pass
    freelist, _complete = ff.freelist_pages(image)
    claimed |= freelist


def _loss(report: _TableReport, sequence: int | None, doubts: list[str]) -> dict[str, Any]:
    """Rows lost: exact where the file says so (the unreadable cells of a readable page),
    else estimated from the rowids missing in the key ranges of the unreadable pages; unknown
    where ``doubts`` say why no count can be trusted (the views disagree, the table's own
    count does not match, a sidecar could not be fully applied)."""
    if doubts:
        return {"lost": None, "lost_exact": False, "lost_basis": "; ".join(doubts)}
    if not report.damaged:
        return {"lost": 0, "lost_exact": True, "lost_basis": None}
    if report.method == "sql":
        return {"lost": None, "lost_exact": False,
                "lost_basis": "SQLite stopped reading and the table cannot be read page by page"}
    if report.shape.root is None:
        return {"lost": None, "lost_exact": False,
                "lost_basis": "the schema is lost: rows were found by shape, losses are unknown"}
    cells = sum(p.cells for p in report.bad_pages if p.cells is not None)
    ranges = [p for p in report.bad_pages if p.cells is None]
    if not ranges:
        return {"lost": cells, "lost_exact": True, "lost_basis": "unreadable cells"}
    return {
        "lost": _missing_rowids(report, ranges, sequence) + cells,
        "lost_exact": False,
        "lost_basis": "rowids missing from the key ranges of unreadable pages "
        "(an upper bound: rows deleted before the damage count too)",
    }


def _missing_rowids(report: _TableReport, ranges: list[ff.BadPage], sequence: int | None) -> int:
    """Rowids missing from the key ranges of the unreadable pages ``ranges`` (a range open
    at the top ends at the highest rowid known: the sequence, or one read)."""
    rowids = sorted(report.page_rowids)
    top = max(sequence or 0, rowids[-1] if rowids else 0, report.last_sql_rowid or 0)
    gaps = 0
    for page in ranges:
        low = page.low if page.low is not None else 0
        high = page.high if page.high is not None else top
        if high > low:
            held = bisect.bisect_right(rowids, high) - bisect.bisect_right(rowids, low)
            gaps += max(0, (high - low) - held)
    return gaps


class _Writer:
    """Inserts salvaged rows into the output in batches; a batch that violates a constraint
    is retried row by row so one bad row costs only itself. A message's ``search_cjk`` is
    left out: the index rebuild recomputes it (the source's is never trusted). Without an
    output it only counts (inspect-only, and the runtime ledgers)."""

    def __init__(self, out: sqlite3.Connection | None) -> None:
        self.out = out
        self._statements: dict[tuple[str, int], tuple[str, list[int]]] = {}

    def _statement(self, report: _TableReport, width: int) -> tuple[str, list[int]]:
        """The INSERT for records of ``width`` values, and which values it takes: the output
        table's columns, by name (older records are shorter; unknown columns are dropped)."""
        key = (report.name, width)
        if key not in self._statements:
            assert self.out is not None
            known = {
                r[0]
                for r in self.out.execute("SELECT name FROM pragma_table_info(?)", (report.name,))
            }
            keep = [
                i
                for i, c in enumerate(report.shape.columns[:width])
                if c in known and c != "search_cjk"
            ]
            names = ", ".join(quote_identifier(report.shape.columns[i]) for i in keep)
            sql = (
                f"INSERT INTO {quote_identifier(report.name)} ({names})"
                f" VALUES ({', '.join('?' * len(keep))})"
            )
            self._statements[key] = (sql, keep)
        return self._statements[key]

    def write(self, report: _TableReport, rows: list[list[Any]]) -> tuple[list[int], list[str]]:
        """Insert ``rows``: the indices of those inserted, and why the others were refused."""
        if self.out is None:
            return list(range(len(rows))), []
        groups: dict[str, list[tuple[int, list[Any]]]] = {}
        for index, values in enumerate(rows):
            sql, keep = self._statement(report, len(values))
            groups.setdefault(sql, []).append((index, [values[i] for i in keep]))
        inserted: list[int] = []
        refused: list[str] = []
        for sql, params in groups.items():
            try:
                with transaction(self.out):
                    self.out.executemany(sql, [one for _, one in params])
                inserted += [index for index, _ in params]
                continue
            except sqlite3.IntegrityError:
                pass
            for index, one in params:
                try:
                    with transaction(self.out):
                        self.out.execute(sql, one)
                    inserted.append(index)
                except sqlite3.IntegrityError as exc:
                    refused.append(str(exc))
        return inserted, refused


_IDS_KEPT = 100  # rowids listed in the report per kind, at most


class _Merge:
    """Every salvaged row passes here on its way to the output: each rowid once per table,
    the newest view first, so a row an older view also holds comes from the newer one and a
    row only an older view holds is still kept (and counted as such). Rowids no row of the
    table can have (≤ 0, or above a sane sequence; see :func:`_rowid_bounds`) are set aside
    and reported. A row a constraint refuses does not take its rowid: an older view's version
    may still fill it."""

    def __init__(self, writer: _Writer, counter: _Writer, bounds: Mapping[str, int],
                 newest: str, say: Progress) -> None:
        self.writer, self.counter = writer, counter
        self.bounds = bounds
        self.newest = newest
        self.say = say
        self.seen: dict[str, set[int]] = {}

    def copy(self, target: _TableReport, read: _TableReport, view: str,
             rows: Iterable[tuple[int | None, list[Any]]]) -> None:
        """Offer ``rows`` of ``read`` (the table as ``view`` holds it) to ``target``."""
        newest = view == self.newest
        tally = target.views.setdefault(view, _ViewTally())
        batch: list[tuple[int | None, list[Any]]] = []
        for rowid, values in rows:
            tally.read += 1
            if newest:
                target.found += 1
                if target.found % 10000 == 0:
                    self.say(f"reading {target.name}", target.found, target.source_count)
            if not self._admit(target, read, newest, rowid, values):
                continue
            if not newest:
                tally.only_here += 1
                target.found += 1
            batch.append((rowid, values))
            if len(batch) >= _INSERT_BATCH:
                self._flush(target, tally, newest, batch)
                batch = []
        self._flush(target, tally, newest, batch)

    def _admit(self, target: _TableReport, read: _TableReport, newest: bool,
               rowid: int | None, values: list[Any]) -> bool:
        """Whether a row goes on to the output, taking its rowid if so. Not: the FTS
        markers, a rowid already taken (a duplicate), an impossible rowid (set aside), a
        row without a rowid from an older view (it cannot be matched across views)."""
        if target.name == "state_meta" and values and values[0] in _FTS_MARKERS:
            if newest:
                target.skipped += 1
            return False
        if rowid is None:
            return newest
        seen = self.seen.setdefault(target.name, set())
        if rowid in seen:
            if newest:
                target.duplicates += 1
            return False
        if self._impossible(target, rowid):
            if len(target.impossible) < _IDS_KEPT:
                target.impossible.append(rowid)
            target.impossible_count += 1
            read.page_rowids.discard(rowid)
            return False
        seen.add(rowid)  # taken now, so a second copy in this batch is a duplicate
        return True

    def _impossible(self, target: _TableReport, rowid: int) -> bool:
        """No row of the table can have ``rowid``: ≤ 0 (unless the table is unknown), or
        above the table's sane sequence."""
        high = self.bounds.get(target.name)
        return (not target.unknown and rowid <= 0) or (high is not None and rowid > high)

    def _flush(self, target: _TableReport, tally: _ViewTally, newest: bool,
               batch: list[tuple[int | None, list[Any]]]) -> None:
        if not batch:
            return
        sink = self.counter if target.excluded else self.writer
        inserted, refused = sink.write(target, [values for _, values in batch])
        if refused:  # a refused row gives its rowid back: an older view's version may fit
            seen = self.seen.setdefault(target.name, set())
            kept = set(inserted)
            seen.difference_update(
                rowid for i, (rowid, _) in enumerate(batch) if i not in kept and rowid is not None)
        if not newest:
            tally.ids += [rowid for rowid, _ in (batch[i] for i in inserted)
                          if rowid is not None][: max(0, _IDS_KEPT - len(tally.ids))]
        tally.copied += len(inserted)
        target.copied += len(inserted)
        if newest:
            target.rejected += len(refused)
            target.rejections += refused[: max(0, 5 - len(target.rejections))]
        else:
            tally.refused += len(refused)


def _rowid_bounds(plans: list[_Plan]) -> dict[str, int]:
    """The highest rowid each AUTOINCREMENT table can hold: its ``sqlite_sequence`` value
    (the highest any view has), where that is sane, i.e. at least the largest rowid SQLite
    finds in the table of every view that can seek it. A sequence damaged downwards would
    otherwise refuse genuine rows; one damaged upwards only bounds nothing."""
    bounds = {}
    for name in {n for plan in plans for n in plan.source_seq}:
        seq = max(plan.source_seq.get(name, 0) for plan in plans)
        tops = [plan.max_rowid[name] for plan in plans if name in plan.max_rowid]
        if seq > 0 and all(top <= seq for top in tops):
            bounds[name] = seq
    return bounds


def _same_columns(read: _TableShape, target: _TableShape) -> bool:
    """Records of ``read`` fit ``target`` position by position (columns are only ever added
    at the end, so an older table's columns are a prefix of the newer one's)."""
    shorter = min(len(read.columns), len(target.columns))
    return read.columns[:shorter] == target.columns[:shorter]


def _salvage(view: _View, vplan: _Plan, plan: _Plan, merge: _Merge, say: Progress) -> None:
    """Read every table of ``view`` into the merge: through SQLite, the rest of a table
    SQLite stops reading page by page, then the pages no tree reaches."""
    claimed: set[int] = set()
    targets: dict[str, _TableReport] = {}
    for read in vplan.reports():
        target = plan.copy.get(read.name) or plan.excluded.get(read.name)
        if target is None or not _same_columns(read.shape, target.shape):
            view.notes.append(f"table {read.name} as the {view.name} view holds it does not "
                              "match the newest schema; its rows there were not read")
            continue
        targets[read.name] = target
        _salvage_table(view, read, target, claimed, merge, say)
    damaged = [r for r in vplan.reports() if r.damaged and r.name in targets]
    if damaged:
        say("searching unreferenced pages", 0, None)
        _salvage_orphans(view, vplan, targets, damaged, claimed, merge)


def _salvage_table(view: _View, read: _TableReport, target: _TableReport, claimed: set[int],
                   merge: _Merge, say: Progress) -> None:
    """Read one table of ``view`` into the merge: through SQLite (from an older view, only
    rows the merge has not taken), then page by page where SQLite stopped."""
    rows = _sql_rows(view, read) if read is target else _sql_rows_not_in(
        view, read, merge.seen.get(read.name, set()))
    merge.copy(target, read, view.name, rows)
    if read.error is not None:
        where = "" if read is target else f" ({view.name})"
        say(f"reading {read.name} page by page{where}", target.found, None)
        merge.copy(target, read, view.name, _page_rows(view, read, claimed))


def _salvage_orphans(view: _View, vplan: _Plan, targets: dict[str, _TableReport],
                     damaged: list[_TableReport], claimed: set[int], merge: _Merge) -> None:
    """Copy the rows of the pages no tree reaches, in batches per owning table."""
    pending: dict[str, tuple[_TableReport, list[tuple[int | None, list[Any]]]]] = {}
    for owner, rowid, values in _orphan_rows(view, vplan, claimed, damaged):
        batch = pending.setdefault(owner.name, (owner, []))[1]
        batch.append((rowid, values))
        if len(batch) >= _INSERT_BATCH:
            merge.copy(targets[owner.name], owner, view.name, pending.pop(owner.name)[1])
    for owner, rows_left in pending.values():
        merge.copy(targets[owner.name], owner, view.name, rows_left)


# Sessions referenced by recovered rows whose own row was lost get a placeholder row.
ORPHAN_SESSIONS_SQL = """
SELECT session_id, MIN(t0), MAX(t1), SUM(active) FROM (
    SELECT session_id, timestamp AS t0, timestamp AS t1, active FROM messages
    UNION ALL
    SELECT session_id, first_used_at, last_used_at, 0 FROM session_model_usage
)
WHERE session_id IS NOT NULL AND session_id NOT IN (SELECT id FROM sessions)
GROUP BY session_id
"""
PLACEHOLDER_SESSION_SQL = """
INSERT INTO sessions (id, source, started_at, ended_at, end_reason, message_count)
VALUES (?, 'recovered', ?, ?, 'recovered', ?)
"""


def _earlier_delegations_table(out: sqlite3.Connection, plan: _Plan) -> None:
    """A source whose ``async_delegations`` has this library's earlier shape has its rows
    copied into a table of that shape, which :func:`_finish_output` rebuilds into the declared
    one (as a writable open does), so none is refused for the columns it lacks."""
    report = plan.copy.get("async_delegations")
    if report is None or not report.sql or not OLD_DELEGATION_COLUMNS <= set(report.shape.columns):
        return
    out.execute("DROP TABLE async_delegations")
    out.execute(report.sql)


def _carry_sequences(out: sqlite3.Connection, plan: _Plan) -> None:
    """Raise each copied table's ``sqlite_sequence`` to the source's, so no id is reused."""
    for name, seq in plan.source_seq.items():
        if name not in plan.copy or not table_exists(out, name):
            continue
        row = out.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (name,)).fetchone()
        if row is None:
            out.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (name, seq))
        elif row[0] < seq:
            out.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (seq, name))


def _finish_output(
    out: sqlite3.Connection, plan: _Plan, say: Progress, defer_index: bool = False
) -> tuple[list[str], dict[str, Any]]:
    """Placeholders, sequences, data invariants, indexes, FTS rebuild, version, checks."""
    now = datetime.datetime.now(datetime.UTC).timestamp()
    with transaction(out):
        orphans = out.execute(ORPHAN_SESSIONS_SQL).fetchall()
        out.executemany(
            PLACEHOLDER_SESSION_SQL,
            [(sid, t0 if t0 is not None else now, t1, n or 0) for sid, t0, t1, n in orphans],
        )
        _carry_sequences(out, plan)
        reshape_delegations(out)
        restore_data_invariants(out)
        outbox = plan.copy.get("delivery_obligations")
        if plan.schema_method == "none" and outbox is not None and not outbox.copied:
            out.execute("DROP TABLE delivery_obligations")  # created lazily: only with rows
    rebuild_indexes(out, say, defer=defer_index)
    checks: dict[str, Any] = {"fts_rebuild": "deferred" if defer_index else "done"}
    with transaction(out):
        out.execute("DELETE FROM schema_version")
        out.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
    mode = out.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    checks.update(journal_mode=mode, quick_check=quick_check(out))
    with transaction(out, rollback_only=True):
        checks["fts_integrity"] = fts.integrity_report(out, against_content=False)
    return [r[0] for r in orphans], checks


def recover_state_db(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str] | None = None,
    *,
    inspect_only: bool = False,
    defer_index: bool = False,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Salvage what the session store at ``source`` still holds into a fresh database.

    The output's FTS indexes are rebuilt before it is published, unless ``defer_index``:
    then they are left to the first writable open (in the background, searches answering
    from canonical rows meanwhile), which gets a large store back in service sooner.

    ``output`` (default ``get_hermes_home()/state-recovered-<UTC timestamp>.db``) must not
    exist; it appears only when complete. With ``inspect_only`` nothing is written anywhere
    but a private temporary directory, and the report says what a recover would copy.
    The source is never written to and never opened by SQLite; nothing is created beside it
    but the output, when asked for there (its working directory is the output's).

    The report: ``tables`` — per copied table ``found`` (rows read), ``copied``, ``rejected``
    (constraint violations), ``lost`` with ``lost_exact``/``lost_basis`` (an estimate unless
    exact; None when it cannot be counted), ``method`` (``sql`` or ``sql+pages``/``pages``
    when the file format had to be read), ``sources`` (rows copied from each view),
    ``only_in`` (per older view: rows only it holds, kept, and some of their ids),
    ``impossible_ids`` (found, not copied), ``verified`` (counts match; ``unverified`` says
    why not); ``excluded`` — the runtime ledgers, found but not copied; ``views`` (what was
    read, newest first); ``journal`` (None, or what the hot rollback journal's rollback
    restored and what it could not); ``wal`` (frames applied, and a damaged frame with the
    commits, frames and rows after it); ``notes`` (plain sentences on all of it);
    ``verified`` and ``output_verified`` (the output holds what was written); ``rebuilt``;
    ``placeholder_sessions`` (sessions whose row was lost but whose messages were not);
    ``readable`` (False only when nothing at all could be read).
    """
    src_path = Path(source).expanduser().absolute()
    _check_source(src_path)
    say = progress or no_progress
    if not inspect_only and fulltext.detected() != fulltext.FULL:
        # The output is built with its FTS indexes (see hermes_state_fulltext).
        raise fulltext.unavailable(fulltext.detected(), "recover")
    out_path = None if inspect_only else _new_output(output, src_path)
    workdir = out_path.parent if out_path is not None else None
    remove_abandoned_temps(workdir, RECOVER_MARK)  # a killed recover's work copies
    # The output is the only file written: its errors name it (the source's are typed).
    with translated_errors(out_path or src_path), tempfile.TemporaryDirectory(
        prefix=temp_prefix(RECOVER_MARK), dir=workdir
    ) as tmp:
        say("copying the source", 0, None)
        src = _Source(src_path, Path(tmp))
        try:
            return _recover(src, src_path, out_path, Path(tmp), say, defer_index)
        finally:
            src.close()


def _check_source(src_path: Path) -> None:
    """Refuse a source that is not a database file, or that this process holds open."""
    check_test_isolation(src_path)
    if not src_path.is_file() or (
        src_path.stat().st_size == 0 and not wal_without_database(src_path)
    ):  # (an empty main file beside a -wal of frames still has pages to salvage)
        raise StateDbUnavailableError(
            f"no database file at {src_path}", reason="uninitialized", path=src_path
        )
    own = [h for h in lock_holders(src_path, exclude_pids=()) if h.pid == os.getpid()]
    if own:
        raise StateDbInUseError(
            f"this process has {src_path} open; recover must run where it is closed "
            "(closing a descriptor would drop this process's locks on it)",
            path=src_path,
        )


def _new_output(output: str | os.PathLike[str] | None, src_path: Path) -> Path:
    """The output's path (default: a timestamped file in the home), which must not exist;
    its directory is created."""
    out_path = Path(output).expanduser().absolute() if output is not None else (
        get_hermes_home() / f"state-recovered-{utc_stamp()}.db"
    )
    if out_path.resolve() in {p.resolve() for p in (src_path, *sidecar_paths(src_path))}:
        raise HermesStateError(f"the output {out_path} would overwrite the source")
    if out_path.exists() or out_path.is_symlink():
        raise HermesStateError(f"the output {out_path} already exists")
    make_private_dir(out_path.parent, for_file=out_path)
    return out_path


def _open_output(partial: Path, plan: _Plan, notes: list[str]) -> sqlite3.Connection:
    """The output under construction at ``partial``, with the tables ``plan`` copies (a
    table it cannot create is dropped from the plan, with a note)."""
    prepare_db_file(partial)
    out = connect(partial, "rw")
    out.execute("PRAGMA journal_mode = MEMORY")
    out.execute("PRAGMA synchronous = OFF")
    ddl = TABLES_SQL + (DELIVERY_OBLIGATIONS_SQL if "delivery_obligations" in plan.copy else "")
    for statement in split_sql(ddl):
        out.execute(statement)
    _earlier_delegations_table(out, plan)
    for report in [r for r in plan.copy.values() if r.unknown]:
        try:  # a table this schema does not know is copied with its own definition
            out.execute(report.sql or "")
        except sqlite3.Error as exc:
            del plan.copy[report.name]
            notes.append(f"table {report.name} was not copied: {exc}")
    return out


def _recover(
    src: _Source, src_path: Path, out_path: Path | None, tmp: Path, say: Progress,
    defer_index: bool = False,
) -> dict[str, Any]:
    plan = _plan(src.primary)
    if plan.foreign:
        raise foreign_database_error(src_path, plan.foreign)
    older = [(view, _plan(view)) for view in src.views[1:]]
    partial = tmp / "output.db"
    out = _open_output(partial, plan, src.notes) if out_path is not None else None
    bounds = _rowid_bounds([plan, *(p for _, p in older)])
    merge = _Merge(_Writer(out), _Writer(None), bounds, src.primary.name, say)
    try:
        _salvage(src.primary, plan, plan, merge, say)
        for view, vplan in older:
            say(f"reading the {view.name} view", 0, None)
            _salvage(view, vplan, plan, merge, say)
        placeholders: list[str] = []
        checks: dict[str, Any] = {}
        if out is not None:
            placeholders, checks = _finish_output(out, plan, say, defer_index)
        result = _assemble(src, src_path, out_path, plan, out, placeholders, checks, bounds)
        if out is not None and out_path is not None:
            out.close()
            out = None
            _publish(partial, out_path)
        return result
    finally:
        if out is not None:
            out.close()


def _publish(partial: Path, output: Path) -> None:
    """Make the finished output durable, then give it its name (never over an existing file)."""
    fd = os.open(partial, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.link(partial, output)
    partial.unlink()
    dir_fd = os.open(output.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _doubts(src: _Source, report: _TableReport, primary: str) -> list[str]:
    """Why the rows lost from this table cannot be counted exactly, even where every page
    read (plain sentences, for the report)."""
    doubts = []
    for view, tally in report.views.items():
        if view != primary and tally.copied:
            doubts.append(f"the views of the source disagree: {tally.copied} rows only "
                          f"{_VIEW_WORDS[view]} holds were kept; rows no view holds cannot be "
                          "counted")
    read = report.views.get(primary, _ViewTally()).read
    if report.source_count is not None and report.source_count != read:
        doubts.append(f"SQLite counts {report.source_count} rows in the table but its b-tree "
                      f"yields {read}")
    if report.impossible_count:
        doubts.append(f"{report.impossible_count} rows with impossible ids were found "
                      "(pages reused or damaged)")
    if src.journal.damaged or src.journal.header_damaged:
        doubts.append("the rollback journal could not be fully rolled back")
    if src.wal.unreplaced:
        doubts.append("pages of damaged -wal frames kept their older content")
    return doubts


# The FTS markers of the output itself: a deferred rebuild sets them, nothing copies them.
OUTPUT_MARKERS_SQL = "SELECT COUNT(*) FROM state_meta WHERE key IN (?, ?, ?)"


def _table_entry(
    src: _Source, report: _TableReport, out: sqlite3.Connection | None, plan: _Plan,
    placeholders: int,
) -> dict[str, Any]:
    """One table's entry in the report: what was found, copied and lost, and whether the
    counts verify."""
    primary = src.primary.name
    entry: dict[str, Any] = {"found": report.found}
    if not report.excluded:
        entry["copied"] = report.copied if out is not None else None
        entry["rejected"] = report.rejected
        if report.skipped:
            entry["skipped"] = report.skipped
    entry.update(_loss(report, plan.source_seq.get(report.name), _doubts(src, report, primary)))
    entry["method"] = report.method
    entry["source_count"] = report.source_count
    entry["sources"] = {view: tally.copied for view, tally in report.views.items()}
    entry.update(_table_details(report, primary, written=out is not None))
    problems = []
    if out is not None and not report.excluded:
        problems += _output_problems(entry, report, out, placeholders)
    read = report.views.get(primary, _ViewTally()).read
    if report.source_count is not None and report.source_count != read:
        problems.append(f"SQLite counts {report.source_count} rows in the source's table "
                        f"but reading it yields {read}")
    if out is not None or report.source_count is not None:
        entry["verified"] = not problems
    if problems:
        entry["unverified"] = problems
    return entry


def _table_details(report: _TableReport, primary: str, *, written: bool) -> dict[str, Any]:
    """The entry's optional details: rows only some views held, duplicates, impossible ids,
    errors, unreadable pages, rejections."""
    details: dict[str, Any] = {}
    only_in = {view: {"found": tally.only_here,
                      "copied": tally.copied if written else None,
                      "refused": tally.refused, "ids": tally.ids}
               for view, tally in report.views.items() if view != primary and tally.only_here}
    if only_in:
        details["only_in"] = only_in
    if report.duplicates:
        details["duplicates"] = report.duplicates
    if report.impossible_count:
        details["impossible_ids"] = {"count": report.impossible_count, "ids": report.impossible}
    if report.error is not None:
        details["error"] = report.error
    if report.bad_pages:
        details["unreadable_pages"] = sorted({p.pgno for p in report.bad_pages})[:100]
    if report.orphan_pages:
        details["unreferenced_pages_read"] = report.orphan_pages
    if report.rejections:
        details["rejections"] = report.rejections
    if report.unknown:
        details["unknown_table"] = True
    return details


def _output_problems(
    entry: dict[str, Any], report: _TableReport, out: sqlite3.Connection, placeholders: int
) -> list[str]:
    """Count the table's rows in the output (``entry["output_count"]``) against those
    written; the mismatch, if any."""
    entry["output_count"] = out.execute(
        f"SELECT COUNT(*) FROM {quote_identifier(report.name)}"
    ).fetchone()[0] if table_exists(out, report.name) else 0
    expected = report.copied + (placeholders if report.name == "sessions" else 0)
    if report.name == "state_meta":  # the output's own markers (a deferred rebuild)
        expected += out.execute(OUTPUT_MARKERS_SQL, _FTS_MARKERS).fetchone()[0]
    if entry["output_count"] == expected:
        return []
    entry["output_verified"] = False
    return [f"the output holds {entry['output_count']} rows where {expected} were written"]


def _journal_entry(src: _Source, in_use: bool) -> dict[str, Any] | None:
    journal = src.journal
    if not journal.hot:
        return None
    entry = {
        "rolled_back_pages": journal.rolled_back_pages,
        "damaged_records": [{"record": n, "page": p} for n, p in journal.damaged][:100],
        "header_damaged": journal.header_damaged,
        "transaction_in_progress": in_use,
    }
    what = ("of a transaction still in progress" if in_use else "left by an interrupted "
            "transaction: a killed restore, repair promotion or write")
    if journal.header_damaged:
        src.notes.append(f"the source has a rollback journal {what}; its header is damaged: "
                         "nothing could be rolled back, so pages may hold uncommitted content")
    else:
        src.notes.append(f"the source has a hot rollback journal {what}; it was rolled back on "
                         f"the private copy first ({journal.rolled_back_pages} pages), so the "
                         "rows read are the committed state; the source is unchanged")
    if journal.damaged:
        pages = ", ".join(str(p) for _, p in journal.damaged[:10])
        src.notes.append(f"{len(journal.damaged)} records of the rollback journal fail their "
                         f"checksum (pages {pages}): those pages could not be restored and may "
                         "hold uncommitted content, so their rows are taken last, only where no "
                         "restored page holds them; every record that verifies was rolled back")
    return entry


def _wal_entry(src: _Source) -> dict[str, Any]:
    scan = src.wal.scan
    entry: dict[str, Any] = {
        "frames": scan.frames, "applied": src.wal.frames, "readable_by_sqlite": scan.readable,
        "stale_frames": scan.stale_frames, "uncommitted_frames": scan.torn_frames,
    }
    if scan.problem:
        entry.update(damaged_frames=scan.damaged[:100], later_commits=scan.later_commits,
                     later_frames=scan.later_frames, rows_after_damage=src.wal_rows,
                     unreplaced_pages=src.wal.unreplaced)
        src.notes.append(scan.describe(src.wal_rows) + "; those commits verify and were "
                         "folded in")
        if src.wal.unreplaced:
            pages = ", ".join(str(p) for p in src.wal.unreplaced[:10])
            src.notes.append(f"pages {pages} of damaged -wal frames are not rewritten by a "
                             "later commit and keep their older content; where that leaves "
                             "the image inconsistent, tables are read page by page")
    return entry


def _assemble(
    src: _Source,
    src_path: Path,
    out_path: Path | None,
    plan: _Plan,
    out: sqlite3.Connection | None,
    placeholders: list[str],
    checks: dict[str, Any],
    bounds: Mapping[str, int],
) -> dict[str, Any]:
    holders = describe_lock_holders(src_path)
    journal = _journal_entry(src, bool(holders))
    wal = _wal_entry(src)
    tables = {
        name: _table_entry(src, r, out, plan, len(placeholders)) for name, r in plan.copy.items()
    }
    excluded = {name: _table_entry(src, r, None, plan, 0) for name, r in plan.excluded.items()}
    for name in RUNTIME_LEDGER_TABLES:
        excluded.setdefault(name, {"found": 0, "present": False})
    for name, report in [*plan.copy.items(), *plan.excluded.items()]:
        _table_notes(src, name, report, bounds)
    return {
        "source": str(src_path),
        "output": str(out_path) if out_path is not None else None,
        "inspect_only": out_path is None,
        "source_in_use": holders,
        "schema_version": _schema_version(src),
        "schema_read_by": plan.schema_method,
        "page_size": src.primary.image.page_size,
        "pages": src.primary.image.page_count,
        "views": [view.name for view in src.views],
        "journal": journal,
        "wal": wal,
        "wal_frames_applied": src.wal.frames,
        "notes": src.notes,
        "tables": tables,
        "excluded": excluded,
        "rebuilt": list(_REBUILT),
        "placeholder_sessions": placeholders,
        **_totals(tables, excluded, plan),
        "checks": checks,
    }


def _schema_version(src: _Source) -> int | None:
    """The source's schema version, when SQLite can read it."""
    if src.primary.sql is None:
        return None
    with contextlib.suppress(sqlite3.Error, HermesStateError):
        return read_version(src.primary.sql)
    return None


def _totals(
    tables: dict[str, dict[str, Any]], excluded: dict[str, dict[str, Any]], plan: _Plan
) -> dict[str, Any]:
    """The report's figures over every table: rows found and lost, whether the copy is
    complete and verified, and whether anything at all could be read."""
    found = sum(t["found"] for t in tables.values()) + sum(t["found"] for t in excluded.values())
    lost_values = [t.get("lost") for t in tables.values()]
    unverified = [f"{name}: {problem}" for name, t in tables.items()
                  for problem in t.get("unverified", [])]
    return {
        "rows_found": found,
        "rows_lost": None if None in lost_values else sum(v or 0 for v in lost_values),
        "complete": all(t.get("lost") == 0 for t in tables.values()),
        "verified": not unverified,
        "output_verified": all(t.get("output_verified", True) for t in tables.values()),
        "unverified": unverified,
        "readable": found > 0 or not any(r.damaged for r in plan.reports()),
    }


def _table_notes(src: _Source, name: str, report: _TableReport, bounds: Mapping[str, int]
                 ) -> None:
    """The report's notes on where a table's rows came from and what was set aside."""
    primary = src.primary.name
    for view, tally in report.views.items():
        if view != primary and tally.only_here:
            src.notes.append(_only_here_note(name, view, tally))
    if report.impossible_count:
        limit = f"above its sequence {bounds[name]} or " if name in bounds else ""
        ids = ", ".join(str(i) for i in report.impossible[:10])
        src.notes.append(f"{name}: {report.impossible_count} rows with impossible ids "
                         f"({limit}≤ 0) were found and not copied: {ids}")
    if report.error is not None and src.wal.scan.problem and report.views.get(primary):
        src.notes.append(f"{name}: the image with the later -wal commits folded in is "
                         f"inconsistent ({report.error}); the rest was read page by page")




# Why rows only an older view holds may differ from the newest, by view.
_ONLY_HERE_WHY = {
    VIEW_FILE: "the -wal's version of their pages differs; they may include rows "
               "deleted after the last checkpoint",
    VIEW_TORN: "no restored page holds them; they may be content the interrupted "
               "transaction never committed: check them",
}


def _only_here_note(name: str, view: str, tally: _ViewTally) -> str:
    """The note on a table's rows only an older ``view`` holds."""
    refused = f" ({tally.refused} refused: a newer row holds their key)" if (
        tally.refused) else ""
    ids = ", ".join(str(i) for i in tally.ids[:10])
    why = _ONLY_HERE_WHY.get(view, "no verified content holds them: check them")
    return (f"{name}: {tally.only_here} rows only {_VIEW_WORDS[view]} holds, "
            f"{tally.copied} kept{refused} ({why}; ids {ids})")
