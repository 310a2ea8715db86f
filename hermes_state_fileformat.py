"""Reading an SQLite database from its bytes: header, b-tree pages, records and the WAL.

SQLite stops reading a table at its first damaged page, though later pages still hold rows. So
salvage reads the file format itself (https://sqlite.org/fileformat2.html). It walks b-trees
taking every cell that parses, noting each bad page's key range to bound the loss. It reads
orphan pages no tree reaches. It folds a ``-wal`` and rolls back a hot ``-journal`` into a
private copy.

SQLite drops every commit after a bad WAL frame. :func:`scan_wal` checks later frames against
their predecessor's checksum, so intact later commits survive. :func:`read_journal` verifies
each record on its own.

Nothing here trusts a pointer: page numbers are range-checked and chains guarded against
cycles. Nothing opens a file with SQLite or writes outside the private copy."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "HEADER_MAGIC",
    "PageError",
    "DatabaseImage",
    "TableCell",
    "BadPage",
    "decode_record",
    "walk_table",
    "walk_index",
    "freelist_pages",
    "iter_orphan_leaves",
    "fold_wal",
    "WalFold",
    "scan_wal",
    "WalScan",
    "read_journal",
    "roll_back_journal",
    "JournalScan",
    "schema_rows",
    "ordinary_tables",
    "table_rowids",
    "wal_damage_rows",
]

HEADER_MAGIC = b"SQLite format 3\x00"
INTERIOR_INDEX, INTERIOR_TABLE, LEAF_INDEX, LEAF_TABLE = 0x02, 0x05, 0x0A, 0x0D
_ENCODINGS = {1: "utf-8", 2: "utf-16-le", 3: "utf-16-be"}
_PENDING_BYTE = 0x40000000
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class PageError(Exception):
    """A page, cell, chain or record that does not parse."""


def _u16(buf: bytes, pos: int) -> int:
    if pos + 2 > len(buf):
        raise PageError("truncated")
    value: int = _U16.unpack_from(buf, pos)[0]
    return value


def _u32(buf: bytes, pos: int) -> int:
    if pos + 4 > len(buf):
        raise PageError("truncated")
    value: int = _U32.unpack_from(buf, pos)[0]
    return value


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it (1–9 bytes, big-endian)."""
    value = 0
    for i in range(9):
        if pos + i >= len(buf):
            raise PageError("truncated varint")
        byte = buf[pos + i]
        if i == 8:
            return (value << 8) | byte, pos + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, pos + i + 1
    raise AssertionError("unreachable")


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


# --- the file ---------------------------------------------------------------------------------


class DatabaseImage:
    """A read-only view of a database file, one page at a time (``os.pread``, no caching).

    A damaged header is tolerated: ``header_valid`` is False and the page size falls back to
    ``page_size`` (the WAL's, when known) or 4096, the encoding to UTF-8.

    With ``wal`` and ``frames`` (page number → offset of that page's content in ``wal``) the
    view is the file as those WAL frames make it, without writing anything: pages in
    ``frames`` are read from the WAL, and ``db_pages`` (the size a commit frame declares)
    bounds the page count.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        page_size: int | None = None,
        wal: str | os.PathLike[str] | None = None,
        frames: Mapping[int, int] | None = None,
        db_pages: int | None = None,
    ) -> None:
        self.path = Path(path)
        self._frames = dict(frames or {})
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        self._wal_fd = -1
        try:
            if wal is not None and self._frames:
                self._wal_fd = os.open(wal, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            size = os.fstat(self._fd).st_size
            if 1 in self._frames:
                header = os.pread(self._wal_fd, 100, self._frames[1])
            else:
                header = os.pread(self._fd, 100, 0)
        except BaseException:
            self.close()
            raise
        self._take_header(header, page_size or 4096)
        self.page_count = size // self.page_size
        if db_pages is not None:
            self.page_count = db_pages
        elif self._frames:
            self.page_count = max(self.page_count, max(self._frames))
        self.lock_page = _PENDING_BYTE // self.page_size + 1

    def _take_header(self, header: bytes, fallback_page_size: int) -> None:
        """The page size, encoding and freelist the 100-byte ``header`` declares; where it
        is damaged (``header_valid`` False), ``fallback_page_size``, UTF-8 and no freelist."""
        self.header_valid = False
        self.page_size = fallback_page_size
        self.usable_size = self.page_size
        self.encoding = "utf-8"
        self.freelist_trunk = 0
        self.freelist_count = 0
        if len(header) != 100 or header[:16] != HEADER_MAGIC:
            return
        raw = _u16(header, 16)
        declared = 65536 if raw == 1 else raw
        encoding = _ENCODINGS.get(_u32(header, 56))
        if 512 <= declared <= 65536 and declared & (declared - 1) == 0 and encoding:
            self.header_valid = True
            self.page_size = declared
            self.usable_size = declared - header[20]  # less the bytes reserved per page
            self.encoding = encoding
            self.freelist_trunk = _u32(header, 32)
            self.freelist_count = _u32(header, 36)

    def close(self) -> None:
        for name in ("_fd", "_wal_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)

    def __enter__(self) -> DatabaseImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def valid_page(self, pgno: int) -> bool:
        return 1 <= pgno <= self.page_count and pgno != self.lock_page

    def page(self, pgno: int) -> bytes:
        if not self.valid_page(pgno):
            raise PageError(f"page {pgno} is outside the file (1..{self.page_count})")
        at = self._frames.get(pgno)
        try:
            if at is not None:
                data = os.pread(self._wal_fd, self.page_size, at)
            else:
                data = os.pread(self._fd, self.page_size, (pgno - 1) * self.page_size)
        except OSError as exc:
            raise PageError(f"page {pgno} cannot be read: {exc.strerror}") from exc
        if len(data) != self.page_size:
            raise PageError(f"page {pgno} is truncated")
        return data

    # Payload bytes kept on a b-tree page before the rest spills to overflow pages.
    def local_payload(self, size: int, *, index: bool) -> int:
        u = self.usable_size
        most = ((u - 12) * 64 // 255) - 23 if index else u - 35
        if size <= most:
            return size
        least = ((u - 12) * 32 // 255) - 23
        k = least + (size - least) % (u - 4)
        return k if k <= most else least

    def overflow(self, first: int, remaining: int, visited: set[int]) -> bytes:
        """The ``remaining`` payload bytes held in the overflow chain starting at ``first``.

        The chain must end exactly where the payload does (next pointer 0 on its last page);
        its pages join ``visited`` only when the whole chain read cleanly."""
        chunks, seen, pgno = [], [], first
        room = self.usable_size - 4
        while remaining > 0:
            if pgno < 2 or pgno in seen or not self.valid_page(pgno):
                raise PageError(f"overflow chain broken at page {pgno}")
            seen.append(pgno)
            data = self.page(pgno)
            take = min(remaining, room)
            chunks.append(data[4 : 4 + take])
            remaining -= take
            pgno = _u32(data, 0)
        if pgno != 0:
            raise PageError("overflow chain longer than its payload")
        visited.update(seen)
        return b"".join(chunks)


# --- records ----------------------------------------------------------------------------------

_INT_SIZES = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8}


def decode_record(payload: bytes, encoding: str = "utf-8") -> list[Any]:
    """The column values of a record; raises :class:`PageError` unless it decodes exactly.

    REAL values SQLite stored as integers come back as ints: the caller applies affinity."""
    header_size, pos = read_varint(payload, 0)
    if header_size < 1 or header_size > len(payload):
        raise PageError("record header out of bounds")
    types = []
    while pos < header_size:
        serial, pos = read_varint(payload, pos)
        types.append(serial)
    if pos != header_size:
        raise PageError("record header overruns")
    values: list[Any] = []
    body = header_size
    for serial in types:
        if serial == 0:
            values.append(None)
        elif serial in _INT_SIZES:
            n = _INT_SIZES[serial]
            if body + n > len(payload):
                raise PageError("record body truncated")
            values.append(int.from_bytes(payload[body : body + n], "big", signed=True))
            body += n
        elif serial == 7:
            if body + 8 > len(payload):
                raise PageError("record body truncated")
            values.append(struct.unpack_from(">d", payload, body)[0])
            body += 8
        elif serial in (8, 9):
            values.append(serial - 8)
        elif serial >= 12:
            n = (serial - 12) // 2
            if body + n > len(payload):
                raise PageError("record body truncated")
            raw = payload[body : body + n]
            body += n
            if serial % 2:
                try:
                    values.append(raw.decode(encoding))
                except UnicodeDecodeError as exc:
                    raise PageError("text is not valid in the database encoding") from exc
            else:
                values.append(bytes(raw))
        else:
            raise PageError(f"reserved serial type {serial}")
    if body != len(payload):
        raise PageError("record length does not match its header")
    return values


# --- b-trees ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableCell:
    rowid: int
    payload: bytes
    pgno: int


@dataclass(frozen=True)
class BadPage:
    """A page (or some cells of it) that could not be read. ``low``/``high`` bound the rowids
    it held (``low`` < rowid ≤ ``high``; None: unbounded on that side); ``cells`` is the
    number of unreadable cells when the page itself parsed."""

    pgno: int
    reason: str
    low: int | None = None
    high: int | None = None
    cells: int | None = None


@dataclass
class _PageHeader:
    kind: int
    cells: int
    right: int
    pointers: int  # offset of the cell pointer array


def _page_header(img: DatabaseImage, pgno: int, data: bytes) -> _PageHeader:
    start = 100 if pgno == 1 else 0
    kind = data[start]
    if kind not in (INTERIOR_INDEX, INTERIOR_TABLE, LEAF_INDEX, LEAF_TABLE):
        raise PageError(f"page {pgno} is not a b-tree page (type byte {kind})")
    interior = kind in (INTERIOR_INDEX, INTERIOR_TABLE)
    cells = _u16(data, start + 3)
    pointers = start + (12 if interior else 8)
    if pointers + 2 * cells > img.usable_size:
        raise PageError(f"page {pgno} claims {cells} cells, more than fit")
    right = _u32(data, start + 8) if interior else 0
    return _PageHeader(kind, cells, right, pointers)


def _cell_offsets(img: DatabaseImage, data: bytes, head: _PageHeader) -> list[int]:
    floor = head.pointers + 2 * head.cells
    offsets = []
    for i in range(head.cells):
        off = _u16(data, head.pointers + 2 * i)
        if not floor <= off < img.usable_size:
            offsets.append(-1)
        else:
            offsets.append(off)
    return offsets


def _table_leaf_cell(
    img: DatabaseImage, data: bytes, off: int, visited: set[int]
) -> tuple[int, bytes]:
    size, pos = read_varint(data, off)
    rowid, pos = read_varint(data, pos)
    local = img.local_payload(size, index=False)
    end = pos + local
    if end + (4 if local < size else 0) > img.usable_size:
        raise PageError("cell overruns its page")
    payload = data[pos:end]
    if local < size:
        payload += img.overflow(_u32(data, end), size - local, visited)
    return _signed64(rowid), payload


def _child(img: DatabaseImage, pgno: int) -> int:
    if pgno < 2 or not img.valid_page(pgno):
        raise PageError(f"child pointer {pgno} is outside the file")
    return pgno


def _interior_table_children(
    img: DatabaseImage, data: bytes, head: _PageHeader, low: int | None, high: int | None
) -> list[tuple[int, int | None, int | None]]:
    """(child, low, high) for each child of an interior table page, in key order."""
    children: list[tuple[int, int | None, int | None]] = []
    previous = low
    for off in _cell_offsets(img, data, head):
        if off < 0:
            raise PageError("cell pointer outside the page")
        child = _child(img, _u32(data, off))
        key = _signed64(read_varint(data, off + 4)[0])
        if previous is not None and key <= previous:
            raise PageError("keys out of order")
        children.append((child, previous, key))
        previous = key
    children.append((_child(img, head.right), previous, high))
    return children


def walk_table(
    img: DatabaseImage, root: int, visited: set[int] | None = None
) -> Iterator[TableCell | BadPage]:
    """Every readable cell of the table b-tree at ``root``, in key order, and a
    :class:`BadPage` for each page (or group of cells) that could not be read.

    Pages (and overflow pages) that were read join ``visited``; a page already in it is not
    read again (a cycle, or a page two trees claim)."""
    visited = set() if visited is None else visited
    stack: list[tuple[int, int | None, int | None]] = [(root, None, None)]
    while stack:
        pgno, low, high = stack.pop()
        if pgno in visited:
            yield BadPage(pgno, "page reached twice", low, high)
            continue
        try:
            data = img.page(pgno)
            head = _page_header(img, pgno, data)
            if head.kind == INTERIOR_TABLE:
                children = _interior_table_children(img, data, head, low, high)
            elif head.kind != LEAF_TABLE:
                raise PageError(f"page {pgno} is an index page inside a table b-tree")
        except PageError as exc:
            yield BadPage(pgno, str(exc), low, high)
            continue
        visited.add(pgno)
        if head.kind == INTERIOR_TABLE:
            stack.extend(reversed(children))
            continue
        bad = 0
        for off in _cell_offsets(img, data, head):
            try:
                if off < 0:
                    raise PageError("cell pointer outside the page")
                rowid, payload = _table_leaf_cell(img, data, off, visited)
            except PageError:
                bad += 1
                continue
            yield TableCell(rowid, payload, pgno)
        if bad:
            yield BadPage(pgno, f"{bad} unreadable cell(s)", low, high, cells=bad)


def walk_index(img: DatabaseImage, root: int, visited: set[int]) -> list[BadPage]:
    """Add the pages of the index b-tree at ``root`` (overflow pages included) to ``visited``;
    returns the pages that could not be read. Index keys themselves are not decoded."""
    bad: list[BadPage] = []
    stack = [root]
    while stack:
        pgno = stack.pop()
        if pgno in visited:
            continue
        try:
            data = img.page(pgno)
            head = _page_header(img, pgno, data)
            if head.kind not in (INTERIOR_INDEX, LEAF_INDEX):
                raise PageError(f"page {pgno} is a table page inside an index b-tree")
            offsets = _cell_offsets(img, data, head)
        except PageError as exc:
            bad.append(BadPage(pgno, str(exc)))
            continue
        visited.add(pgno)
        interior = head.kind == INTERIOR_INDEX
        if interior:
            stack.append(head.right)
        for off in offsets:
            try:
                if off < 0:
                    raise PageError("cell pointer outside the page")
                pos = off
                if interior:
                    stack.append(_child(img, _u32(data, off)))
                    pos += 4
                size, pos = read_varint(data, pos)
                local = img.local_payload(size, index=True)
                if local < size:
                    img.overflow(_u32(data, pos + local), size - local, visited)
            except PageError:
                continue
    return bad


def freelist_pages(img: DatabaseImage) -> tuple[set[int], bool]:
    """The pages on the freelist, and whether the whole list could be read."""
    pages: set[int] = set()
    trunk = img.freelist_trunk
    room = img.usable_size // 4 - 2
    try:
        while trunk:
            if trunk in pages or not img.valid_page(trunk):
                return pages, False
            pages.add(trunk)
            data = img.page(trunk)
            count = _u32(data, 4)
            if count > room:
                return pages, False
            for i in range(count):
                leaf = _u32(data, 8 + 4 * i)
                if not img.valid_page(leaf):
                    return pages, False
                pages.add(leaf)
            trunk = _u32(data, 0)
    except PageError:
        return pages, False
    return pages, len(pages) == img.freelist_count


def iter_orphan_leaves(
    img: DatabaseImage, claimed: set[int]
) -> Iterator[tuple[int, list[TableCell], int]]:
    """(page, cells, unreadable cells) for every table leaf page no tree or list claims."""
    for pgno in range(2, img.page_count + 1):
        if pgno in claimed or pgno == img.lock_page:
            continue
        try:
            data = img.page(pgno)
            if data[0] != LEAF_TABLE:
                continue
            head = _page_header(img, pgno, data)
            offsets = _cell_offsets(img, data, head)
        except PageError:
            continue
        cells, bad, overflow = [], 0, set[int]()
        for off in offsets:
            try:
                if off < 0:
                    raise PageError("cell pointer outside the page")
                rowid, payload = _table_leaf_cell(img, data, off, overflow)
            except PageError:
                bad += 1
                continue
            cells.append(TableCell(rowid, payload, pgno))
        if cells:
            yield pgno, cells, bad


# --- the schema and rowids ---------------------------------------------------------------------


def schema_rows(img: DatabaseImage) -> list[tuple[Any, ...]]:
    """The rows of ``sqlite_master`` (type, name, tbl_name, rootpage, sql) that still parse,
    read from the b-tree at page 1."""
    rows = []
    for cell in walk_table(img, 1):
        if isinstance(cell, TableCell):
            try:
                values = decode_record(cell.payload, img.encoding)
            except PageError:
                continue
            if len(values) == 5 and isinstance(values[1], str):
                rows.append(tuple(values))
    return rows


def ordinary_tables(rows: list[tuple[Any, ...]]) -> dict[str, int]:
    """Name → root page of the ordinary tables among ``sqlite_master`` rows: not SQLite's own,
    not virtual tables and not the shadow tables a virtual table keeps its data in."""
    virtual = {r[1] for r in rows if r[0] == "table" and isinstance(r[4], str)
               and r[4].lstrip().upper().startswith("CREATE VIRTUAL")}
    return {row[1]: row[3] for row in rows if _ordinary(row, virtual)}


def _ordinary(row: tuple[Any, ...], virtual: set[str]) -> bool:
    """An ``sqlite_master`` row of a table with a root page and its SQL that is not SQLite's
    own, not one of the ``virtual`` tables, nor one of their shadow tables."""
    kind, name, _tbl, root, sql = row
    if kind != "table" or not isinstance(root, int) or root <= 0 or not isinstance(sql, str):
        return False
    return not (name.startswith("sqlite_") or name in virtual
                or any(name.startswith(v + "_") for v in virtual))


def table_rowids(img: DatabaseImage, root: int) -> set[int]:
    """The rowids of every readable leaf cell of the table b-tree at ``root``; payloads are not
    read (overflow chains neither), so this costs one read per page. Unreadable pages and
    cells are skipped: the set is what the tree still says it holds."""
    rowids: set[int] = set()
    visited: set[int] = set()
    stack = [root]
    while stack:
        pgno = stack.pop()
        if pgno in visited:
            continue
        visited.add(pgno)
        try:
            data = img.page(pgno)
            head = _page_header(img, pgno, data)
            offsets = _cell_offsets(img, data, head)
            if head.kind == INTERIOR_TABLE:
                stack.extend(c for c, _, _ in _interior_table_children(img, data, head, None,
                                                                       None))
                continue
            if head.kind != LEAF_TABLE:
                continue
        except PageError:
            continue
        for off in offsets:
            if off < 0:
                continue
            try:
                _size, pos = read_varint(data, off)
                rowids.add(_signed64(read_varint(data, pos)[0]))
            except PageError:
                continue
    return rowids


# --- the WAL ----------------------------------------------------------------------------------

_WAL_MAGIC = (0x377F0682, 0x377F0683)
_WAL_HEADER = struct.Struct(">8I")
_FRAME_HEADER = struct.Struct(">6I")
_FRAME_OK, _FRAME_BAD, _FRAME_STALE = "ok", "bad", "stale"


def _wal_checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


@dataclass
class WalScan:
    """A ``-wal`` verified frame by frame (see :func:`scan_wal`). Frames are numbered from 1;
    frame 0 stands for the WAL header.

    ``readable`` frames are what SQLite reads (up to the last commit before the first frame
    that fails); ``damaged`` lists the frames that fail verification although an intact
    commit with the current salts follows them, so SQLite silently drops ``later_commits``
    commits (``later_frames`` intact frames). ``stale_frames`` (an earlier WAL generation,
    after a reset) and ``torn_frames`` (after the last commit: a transaction that never
    committed) are no problem."""

    page_size: int | None = None
    frames: int = 0
    readable: int = 0
    db_pages: int | None = None
    damaged: list[int] = field(default_factory=list)
    later_frames: int = 0
    later_commits: int = 0
    stale_frames: int = 0
    torn_frames: int = 0
    notes: list[str] = field(default_factory=list)
    # (page, database size after the commit or 0, verdict) of each frame, in order.
    _frames: list[tuple[int, int, str]] = field(default_factory=list, repr=False)

    @property
    def problem(self) -> bool:
        return bool(self.damaged)

    def describe(self, rows: Mapping[str, int]) -> str:
        """The damage in one sentence, with ``rows`` (see :func:`wal_damage_rows`)."""
        first = self.damaged[0]
        where = "its header" if first == 0 else f"frame {first}"
        reads = f"only its first {self.readable} frames" if self.readable else "none of it"
        commits = "commit" if self.later_commits == 1 else "commits"
        frames = "frame" if self.later_frames == 1 else "frames"
        held = ", ".join(f"{n} {table}" for table, n in sorted(rows.items())) or "none"
        return (f"the -wal is damaged at {where}: SQLite reads {reads} and drops the "
                f"{self.later_commits} {commits} after it ({self.later_frames} intact {frames};"
                f" rows only they hold: {held})")

    def last_frame(self, *, salvage: bool) -> int:
        """The last frame a fold applies: SQLite's last readable commit, or with ``salvage``
        the last intact commit frame of the file."""
        if not salvage:
            return self.readable
        commits = [n for n, (_, size, v) in enumerate(self._frames, 1) if v == _FRAME_OK and size]
        return commits[-1] if commits else 0

    def applied_frames(self, *, salvage: bool) -> int:
        """How many intact frames a fold applies."""
        last = self.last_frame(salvage=salvage)
        return sum(1 for _, _, v in self._frames[:last] if v == _FRAME_OK)

    def frame_offset(self, number: int) -> int:
        """Where frame ``number``'s page content starts in the file."""
        assert self.page_size is not None
        return 32 + (number - 1) * (24 + self.page_size) + 24

    def plan(self, *, salvage: bool, unverified: bool = False
             ) -> tuple[dict[int, int], int | None, list[int]]:
        """What to write: page → offset of its newest committed content, the database size
        after the last commit, and the pages of damaged frames that no later committed frame
        rewrites (they keep their older content). Without ``salvage``: SQLite's reading.
        With ``unverified`` a damaged frame's content is written too, as the newest version
        of its page (it never marks a commit): a reading for what only it can still hold."""
        last = self.last_frame(salvage=salvage)
        committed: dict[int, int] = {}
        pending: dict[int, int] = {}
        damaged_pages: dict[int, int] = {}
        db_pages = None
        for number, (pgno, size, verdict) in enumerate(self._frames[:last], 1):
            if verdict != _FRAME_OK:
                damaged_pages[pgno] = number
                if unverified:
                    pending[pgno] = number
                continue
            pending[pgno] = number
            if size:
                committed.update(pending)
                pending.clear()
                db_pages = size
        unreplaced = sorted(p for p, n in damaged_pages.items()
                            if committed.get(p, 0) <= n and 0 < p <= (db_pages or 0))
        offsets = {p: self.frame_offset(n) for p, n in committed.items()
                   if db_pages is None or p <= db_pages}
        return offsets, db_pages, unreplaced


@dataclass(frozen=True)
class _WalHeader:
    big_endian: bool
    salts: tuple[int, int]
    seeds: frozenset[tuple[int, int]]  # what frame 1's checksum may be seeded with
    damaged: bool


def _read_wal_header(wal: Any, scan: WalScan) -> _WalHeader | None:
    """The header's byte order, salts and checksum, or None when it is no WAL header.

    A header that fails is frame 0 of the damage: SQLite then ignores the whole WAL (a
    magic number or page size that is not valid makes it no WAL at all, a checksum that
    fails an ignored one). The scan takes the byte order and page size under which frame 1
    verifies (:func:`_damaged_header`); failing that, when the stored checksum or the salts
    were what was damaged, it seeds frame 1 with the stored checksum and with the one the
    header's bytes give, and takes frame 1's salts."""
    header = wal.read(32)
    if len(header) < 32:
        return None
    magic, _version, page_size, _seq, salt1, salt2, c0, c1 = _WAL_HEADER.unpack(header)
    valid = magic in _WAL_MAGIC and page_size in _PAGE_SIZES
    big = magic & 1 == 1
    computed = _wal_checksum(header[:24], 0, 0, big)
    if valid and computed == (c0, c1):
        scan.page_size = page_size
        return _WalHeader(big, (salt1, salt2), frozenset({(c0, c1)}), False)
    found = _damaged_header(wal, page_size, (salt1, salt2), (c0, c1))
    if found is not None:
        scan.page_size, big = found
        return _WalHeader(big, (salt1, salt2), frozenset({(c0, c1)}), True)
    if not valid:
        scan.notes.append("the -wal header is not valid; the WAL was not applied")
        return None
    scan.page_size = page_size
    return _WalHeader(big, (salt1, salt2), frozenset({(c0, c1), computed}), True)


_PAGE_SIZES = tuple(1 << n for n in range(9, 17))


def _damaged_header(
    wal: Any, page_size: int, salts: tuple[int, int], checksum: tuple[int, int]
) -> tuple[int, bool] | None:
    """The page size and byte order of a damaged header: the only ones under which frame 1
    carries the header's ``salts`` and the checksum seeded with its stored ``checksum``
    (either byte order: a flipped low bit of the magic number makes it the other valid one;
    the stored ``page_size`` when it is valid); None when not exactly one fits."""
    sizes = (page_size,) if page_size in _PAGE_SIZES else _PAGE_SIZES
    fits: list[tuple[int, bool]] = []
    for size in sizes:
        wal.seek(32)
        frame = wal.read(24 + size)
        if len(frame) < 24 + size:
            continue
        pgno, _db_size, f_salt1, f_salt2, f0, f1 = _FRAME_HEADER.unpack_from(frame)
        if not pgno or (f_salt1, f_salt2) != salts:
            continue
        fits += [(size, big) for big in (False, True)
                 if _wal_checksum(frame[24:], *_wal_checksum(frame[:8], *checksum, big), big)
                 == (f0, f1)]
    wal.seek(32)
    return fits[0] if len(fits) == 1 else None


def scan_wal(wal_path: str | os.PathLike[str]) -> WalScan:
    """Verify every frame of ``wal_path`` (only read) the way SQLite does, and past the first
    frame that fails: each later frame against its predecessor's stored checksum (or, when
    that frame's stored checksum is what was damaged, against the checksum its content
    gives), so an intact later frame is recognised whatever came before it. A frame counts
    only with the header's salts; the last intact commit frame ends what can be applied.
    A WAL reset while it is being read (a live store) is noticed and the scan repeated."""
    for _attempt in range(3):
        scan, header = _scan_once(wal_path)
        if header is None or _header_bytes(wal_path) == header:
            return scan
    return scan  # reset three times while being read: a busy WAL, judged as last read


def _header_bytes(wal_path: str | os.PathLike[str]) -> bytes | None:
    try:
        with open(wal_path, "rb") as wal:
            return wal.read(32)
    except FileNotFoundError:
        return None


def _scan_once(wal_path: str | os.PathLike[str]) -> tuple[WalScan, bytes | None]:
    """One pass of :func:`scan_wal`, and the header bytes it verified against (a writer that
    resets the WAL meanwhile changes them: then the pass mixed two generations)."""
    scan = WalScan()
    try:
        wal = open(wal_path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return scan, None
    with wal:
        raw = wal.read(32)
        wal.seek(0)
        header = _read_wal_header(wal, scan)
        if header is None:
            return scan, None
        assert scan.page_size is not None
        size = 24 + scan.page_size
        salts, seeds = header.salts, set(header.seeds)
        while True:
            frame = wal.read(size)
            if len(frame) < size:
                break
            pgno, db_size, f_salt1, f_salt2, f0, f1 = _FRAME_HEADER.unpack_from(frame)
            if header.damaged and not scan._frames:
                salts = (f_salt1, f_salt2)  # the header's salt bytes may be what was damaged
            current = (f_salt1, f_salt2) == salts
            # A frame with other salts is never intact, and its stored checksum is what the
            # next one is seeded with (a single damage does not hit both salts and checksum):
            # the stale tail a WAL reset leaves is not summed.
            computed = {_wal_checksum(frame[24:], *_wal_checksum(frame[:8], *seed,
                                                                 header.big_endian),
                                      header.big_endian) for seed in seeds} if current else set()
            if (f0, f1) in computed and current and pgno:
                verdict = _FRAME_OK
            else:
                verdict = _FRAME_BAD if current else _FRAME_STALE
            scan._frames.append((pgno, db_size, verdict))
            seeds = {(f0, f1)} | (computed if verdict != _FRAME_OK else set())
    _judge(scan, header.damaged)
    return scan, raw


def _judge(scan: WalScan, header_bad: bool) -> None:
    """Sort the verdicts into what SQLite reads, damage, stale frames and a torn tail."""
    frames = scan._frames
    scan.frames = len(frames)
    if header_bad and not frames:
        scan.notes.append("the -wal header checksum fails; the WAL was not applied")
    ok = [n for n, (_, _, v) in enumerate(frames, 1) if v == _FRAME_OK]
    commits = [n for n in ok if frames[n - 1][1]]
    last_commit = commits[-1] if commits else 0
    _no_stale_before(frames, ok[-1] if ok else 0)
    _judge_readable(scan, frames, commits, header_bad)
    _judge_damage(scan, frames, ok, commits, header_bad)
    scan.stale_frames = sum(1 for n in range(last_commit + 1, len(frames) + 1)
                            if frames[n - 1][2] == _FRAME_STALE)
    scan.torn_frames = len(frames) - last_commit - scan.stale_frames


def _no_stale_before(frames: list[tuple[int, int, str]], last_ok: int) -> None:
    """Current-salt frames form a prefix of the file: a frame before an intact current frame
    cannot be of an earlier generation, whatever its salts say, so it is damaged."""
    for n in range(1, last_ok):
        if frames[n - 1][2] == _FRAME_STALE:
            frames[n - 1] = (frames[n - 1][0], frames[n - 1][1], _FRAME_BAD)


def _judge_readable(
    scan: WalScan, frames: list[tuple[int, int, str]], commits: list[int], header_bad: bool
) -> None:
    """What SQLite reads: the commits before the first frame that fails."""
    first_bad = 0 if header_bad else next(
        (n for n, (_, _, v) in enumerate(frames, 1) if v != _FRAME_OK), len(frames) + 1)
    visible = [n for n in commits if n < first_bad]
    scan.readable = visible[-1] if visible else 0
    scan.db_pages = frames[scan.readable - 1][1] if scan.readable else None


def _judge_damage(
    scan: WalScan, frames: list[tuple[int, int, str]], ok: list[int], commits: list[int],
    header_bad: bool,
) -> None:
    """The damaged frames before the last commit, and the commits and frames after them."""
    last_commit = commits[-1] if commits else 0
    scan.damaged = ([0] if header_bad and last_commit else []) + [
        n for n in range(1, last_commit) if frames[n - 1][2] != _FRAME_OK]
    if scan.damaged:
        start = scan.damaged[0]
        scan.later_commits = sum(1 for n in commits if n > start)
        scan.later_frames = sum(1 for n in ok if start < n <= last_commit)


@dataclass
class WalFold:
    """What :func:`fold_wal` did: committed frames applied, distinct pages written, the page
    size the WAL declares and the database size (pages) after its last commit; ``scan`` is
    the verification it rests on, ``unreplaced`` the pages of damaged frames that kept their
    older content."""

    frames: int = 0
    pages: int = 0
    page_size: int | None = None
    db_pages: int | None = None
    ignored_frames: int = 0
    notes: list[str] = field(default_factory=list)
    scan: WalScan = field(default_factory=WalScan)
    unreplaced: list[int] = field(default_factory=list)


def fold_wal(
    wal_path: Path, db_copy: Path, *, salvage: bool = True, unverified: bool = False,
    scan: WalScan | None = None,
) -> WalFold:
    """Write the committed content of ``wal_path`` into ``db_copy`` (what a checkpoint does).

    Without ``salvage`` exactly what SQLite reads: the frames up to the last commit before
    the first frame that fails. With it (the default) also the intact commits after a
    damaged frame (see :func:`scan_wal`; ``scan`` is its result when already at hand); a
    damaged frame's own content is never written, so its page keeps the newest intact
    version it has (unless ``unverified``, see :meth:`WalScan.plan`). ``wal_path`` is only
    read."""
    scan = scan_wal(wal_path) if scan is None else scan
    result = WalFold(page_size=scan.page_size, scan=scan, notes=list(scan.notes))
    offsets, db_pages, unreplaced = scan.plan(salvage=salvage, unverified=unverified) if (
        scan.page_size) else ({}, None, [])
    result.frames = scan.applied_frames(salvage=salvage)
    result.ignored_frames = scan.frames - result.frames
    result.db_pages = db_pages
    result.unreplaced = unreplaced
    if not offsets:
        return result
    assert scan.page_size is not None
    page_size = scan.page_size
    with open(wal_path, "rb") as wal:
        fd = os.open(db_copy, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            for pgno, at in sorted(offsets.items()):
                wal.seek(at)
                os.pwrite(fd, wal.read(page_size), (pgno - 1) * page_size)
            if db_pages:
                os.ftruncate(fd, db_pages * page_size)
        finally:
            os.close(fd)
    result.pages = len(offsets)
    return result


def wal_damage_rows(db_path: str | os.PathLike[str], wal_path: str | os.PathLike[str],
                    scan: WalScan) -> dict[str, int]:
    """Rows per ordinary table that only the commits after a damaged frame hold: present in
    the database those commits make, absent from the one SQLite reads. Both are read in
    place (``db_path`` and ``wal_path`` are only read)."""
    if not scan.problem or scan.page_size is None:
        return {}
    views = []
    for salvage in (False, True):
        offsets, db_pages, _ = scan.plan(salvage=salvage)
        views.append(DatabaseImage(db_path, page_size=scan.page_size, wal=wal_path,
                                   frames=offsets, db_pages=db_pages))
    try:
        before, after = (ordinary_tables(schema_rows(v)) for v in views)
        rows = {}
        for name, root in after.items():
            new = table_rowids(views[1], root)
            if name in before:
                new -= table_rowids(views[0], before[name])
            if new:
                rows[name] = len(new)
        return rows
    finally:
        for view in views:
            view.close()


# --- the rollback journal -----------------------------------------------------------------------

JOURNAL_MAGIC = bytes.fromhex("d9d505f920a163d7")
_UNCOUNTED = 0xFFFFFFFF  # a journal written without syncs: count records from the file size
_MAX_SECTOR = 0x10000


@dataclass
class JournalScan:
    """A rollback journal read as SQLite's hot-journal rollback reads it (``pager_playback``).

    ``hot``: it holds a transaction that never finished, so the main file means nothing until
    its records are written back. ``records`` are (page, offset of the page's original
    content in the journal), in journal order; ``damaged`` the (record number, page) of the
    records whose checksum fails inside the count the header gives — SQLite stops at the
    first one, this reader keeps every record that verifies, so only those pages may still
    hold uncommitted content. ``header_damaged``: it cannot be rolled back at all."""

    hot: bool = False
    page_size: int | None = None
    initial_pages: int | None = None
    records: list[tuple[int, int]] = field(default_factory=list)
    damaged: list[tuple[int, int]] = field(default_factory=list)
    header_damaged: bool = False
    notes: list[str] = field(default_factory=list)

    @property
    def rolled_back_pages(self) -> int:
        return len({p for p, _ in self.records})


def _journal_checksum(page: bytes, nonce: int) -> int:
    """SQLite's record checksum: the nonce plus every 200th byte, counted from the end."""
    return (nonce + sum(page[len(page) - 200 : 0 : -200])) & 0xFFFFFFFF


def _super_journal(fd: int, size: int) -> str | None:
    """The super-journal named at the end of a journal (multi-database commits), if any."""
    if size < 16:
        return None
    tail = os.pread(fd, 16, size - 16)
    length, checksum = _U32.unpack_from(tail, 0)[0], _U32.unpack_from(tail, 4)[0]
    if tail[8:] != JOURNAL_MAGIC or not 0 < length <= min(size - 16, 512):
        return None
    name = os.pread(fd, length, size - 16 - length)
    if (checksum - sum(b - 256 if b > 127 else b for b in name)) & 0xFFFFFFFF:
        return None  # a damaged name: SQLite then rolls back, as for no name
    return name.decode("utf-8", "replace")


def read_journal(path: str | os.PathLike[str], db_page_size: int | None = None) -> JournalScan:
    """Parse the rollback journal at ``path`` (only read). A missing, empty or zeroed journal
    (a finished transaction in DELETE, TRUNCATE or PERSIST mode) is not hot, and neither is
    one whose super-journal is gone (that commit completed)."""
    scan = JournalScan()
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        return scan
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 28, 0)
        if not head or head[0] == 0:
            return scan
        name = _super_journal(fd, size)
        if name is not None and not os.path.exists(name):
            scan.notes.append(f"the journal's super-journal {name} is gone: it committed")
            return scan
        scan.hot = True
        _read_records(fd, size, head, db_page_size, scan)
    finally:
        os.close(fd)
    return scan


def _read_records(fd: int, size: int, head: bytes, db_page_size: int | None,
                  scan: JournalScan) -> None:
    header = _journal_header(head, db_page_size, scan)
    if header is None:
        return
    count, nonce, sector = header
    offset, number = sector, 0
    while True:
        read = _read_segment(fd, size, scan, count, nonce, offset, number)
        if read is None:
            return
        offset, number = read
        offset = -(-offset // sector) * sector  # the next segment starts on a sector boundary
        if offset + sector > size:
            return
        segment = os.pread(fd, 28, offset)
        if segment[:8] != JOURNAL_MAGIC:
            return
        count, nonce = _U32.unpack_from(segment, 8)[0], _U32.unpack_from(segment, 12)[0]
        offset += sector


def _journal_header(
    head: bytes, db_page_size: int | None, scan: JournalScan
) -> tuple[int, int, int] | None:
    """The first segment's record count, checksum nonce and the sector size; the page size
    and initial page count go into ``scan``. None when the header is damaged (noted)."""
    if len(head) < 28 or head[:8] != JOURNAL_MAGIC:
        scan.header_damaged = True
        scan.notes.append("the -journal header is damaged: it cannot be rolled back")
        return None
    count, nonce, pages, sector, page_size = struct.unpack(">5I", head[8:28])
    page_size = page_size or db_page_size or 0
    if not (512 <= page_size <= 65536 and page_size & (page_size - 1) == 0
            and 32 <= sector <= _MAX_SECTOR and sector & (sector - 1) == 0):
        scan.header_damaged = True
        scan.notes.append("the -journal header gives an impossible page or sector size")
        return None
    scan.page_size, scan.initial_pages = page_size, pages
    return count, nonce, sector


def _read_segment(
    fd: int, size: int, scan: JournalScan, count: int, nonce: int, offset: int, number: int
) -> tuple[int, int] | None:
    """Read the records of one journal segment from ``offset`` (record ``number`` first) into
    ``scan``; the offset and number after them, or None where the journal ends."""
    assert scan.page_size is not None and scan.initial_pages is not None
    page_size, pages = scan.page_size, scan.initial_pages
    lock_page = _PENDING_BYTE // page_size + 1
    record = page_size + 8
    counted = count != _UNCOUNTED
    if not counted:
        count = (size - offset) // record
    for _ in range(count):
        if offset + record > size:
            scan.notes.append("the -journal is shorter than its header says")
            return None
        data = os.pread(fd, record, offset)
        pgno, stored = _U32.unpack_from(data, 0)[0], _U32.unpack_from(data, 4 + page_size)[0]
        verified = pgno not in (0, lock_page) and (
            _journal_checksum(data[4 : 4 + page_size], nonce) == stored)
        if verified and pgno <= pages:
            scan.records.append((pgno, offset + 4))
        elif counted:
            # Inside the synced count, a record that fails is damage (SQLite stops at the
            # first), and so is one naming a page past the initial size: such pages are
            # never journaled, so its page number, which no checksum covers, is damaged.
            scan.damaged.append((number, pgno))
        elif pgno in (0, lock_page) or pgno <= pages:
            return None  # a journal written without syncs ends where records stop verifying
        offset += record
        number += 1
    return offset, number


def roll_back_journal(journal_path: Path, db_copy: Path) -> JournalScan:
    """Do to ``db_copy`` what SQLite's rollback of the hot journal at ``journal_path`` does:
    cut it back to its size before the transaction and write every verified record's
    original page back. ``journal_path`` is only read."""
    fd = os.open(db_copy, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        header = os.pread(fd, 100, 0)
        raw = _u16(header, 16) if len(header) >= 18 else 0
        scan = read_journal(journal_path, 65536 if raw == 1 else raw or None)
        if not scan.hot or scan.header_damaged:
            return scan
        assert scan.page_size is not None and scan.initial_pages is not None
        os.ftruncate(fd, scan.initial_pages * scan.page_size)
        with open(journal_path, "rb") as journal:
            for pgno, at in scan.records:
                journal.seek(at)
                os.pwrite(fd, journal.read(scan.page_size), (pgno - 1) * scan.page_size)
    finally:
        os.close(fd)
    return scan
