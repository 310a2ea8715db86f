"""Reading an SQLite database from its bytes: header, b-tree pages, records and the WAL.

Salvage needs this because SQLite reads a table through its b-tree and stops at the first
damaged page ("database disk image is malformed"): the rows on every intact page after it
are still on disk, but SQLite will not hand them over, and rows under a destroyed interior
page cannot even be found by a key search. This module reads the file format directly
(https://sqlite.org/fileformat2.html) so that a salvage can

* walk a table b-tree from its root and take every cell of every page that still parses,
  reporting each page that does not, with the key range it covered (so losses can be
  estimated from the rowids that are missing in that range);
* find the pages no b-tree reaches any more (orphans: leaves under a destroyed interior page)
  and read their cells too;
* fold the committed frames of a ``-wal`` into a private copy of the main file, because a
  database is the main file *plus* its WAL, and ``immutable=1`` would ignore the WAL.

Nothing here trusts a pointer: every page number is range-checked, every chain is guarded
against cycles, every record must decode to exactly its stated length and every text value
must be valid in the database's encoding. It never opens a file with SQLite and never writes
to any file but the private copy :func:`fold_wal` is given.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
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
    """

    def __init__(self, path: str | os.PathLike[str], *, page_size: int | None = None) -> None:
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            size = os.fstat(self._fd).st_size
            header = os.pread(self._fd, 100, 0)
        except BaseException:
            os.close(self._fd)
            raise
        self.header_valid = False
        self.page_size = page_size or 4096
        self.usable_size = self.page_size
        self.encoding = "utf-8"
        self.freelist_trunk = 0
        self.freelist_count = 0
        if len(header) == 100 and header[:16] == HEADER_MAGIC:
            raw = _u16(header, 16)
            declared = 65536 if raw == 1 else raw
            reserved = header[20]
            encoding = _ENCODINGS.get(_u32(header, 56))
            if 512 <= declared <= 65536 and declared & (declared - 1) == 0 and encoding:
                self.header_valid = True
                self.page_size = declared
                self.usable_size = declared - reserved
                self.encoding = encoding
                self.freelist_trunk = _u32(header, 32)
                self.freelist_count = _u32(header, 36)
        self.page_count = size // self.page_size
        self.lock_page = _PENDING_BYTE // self.page_size + 1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> DatabaseImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def valid_page(self, pgno: int) -> bool:
        return 1 <= pgno <= self.page_count and pgno != self.lock_page

    def page(self, pgno: int) -> bytes:
        if not self.valid_page(pgno):
            raise PageError(f"page {pgno} is outside the file (1..{self.page_count})")
        try:
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


# --- the WAL ----------------------------------------------------------------------------------

_WAL_MAGIC = (0x377F0682, 0x377F0683)
_WAL_HEADER = struct.Struct(">8I")
_FRAME_HEADER = struct.Struct(">6I")


def _wal_checksum(data: bytes, s0: int, s1: int, big_endian: bool) -> tuple[int, int]:
    words = struct.unpack(f"{'>' if big_endian else '<'}{len(data) // 4}I", data)
    for i in range(0, len(words), 2):
        s0 = (s0 + words[i] + s1) & 0xFFFFFFFF
        s1 = (s1 + words[i + 1] + s0) & 0xFFFFFFFF
    return s0, s1


@dataclass
class WalFold:
    """What :func:`fold_wal` did: committed frames applied, distinct pages written, the page
    size the WAL declares and the database size (pages) after its last commit."""

    frames: int = 0
    pages: int = 0
    page_size: int | None = None
    db_pages: int | None = None
    ignored_frames: int = 0
    notes: list[str] = field(default_factory=list)


def fold_wal(wal_path: Path, db_copy: Path) -> WalFold:
    """Write the committed content of ``wal_path`` into ``db_copy`` (what a checkpoint does).

    A frame counts only when its salts match the WAL header and the running checksum over
    the header and every frame up to it matches; frames after the last valid commit frame
    are ignored, exactly as SQLite's reader ignores them. ``wal_path`` is only read."""
    result = WalFold()
    try:
        wal = open(wal_path, "rb")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        return result
    with wal:
        header = wal.read(32)
        if len(header) < 32:
            return result
        magic, _version, page_size, _seq, salt1, salt2, c0, c1 = _WAL_HEADER.unpack(header)
        big = magic & 1 == 1
        if magic not in _WAL_MAGIC or page_size < 512 or page_size & (page_size - 1):
            result.notes.append("the -wal header is not valid; the WAL was not applied")
            return result
        if _wal_checksum(header[:24], 0, 0, big) != (c0, c1):
            result.notes.append("the -wal header checksum fails; the WAL was not applied")
            return result
        result.page_size = page_size
        s0, s1 = c0, c1
        pending: dict[int, int] = {}
        committed: dict[int, int] = {}
        index = 0
        while True:
            offset = 32 + index * (24 + page_size)
            frame = wal.read(24 + page_size)
            if len(frame) < 24 + page_size:
                break
            pgno, db_size, f_salt1, f_salt2, f0, f1 = _FRAME_HEADER.unpack_from(frame)
            if (f_salt1, f_salt2) != (salt1, salt2) or pgno == 0:
                break
            s0, s1 = _wal_checksum(frame[:8], s0, s1, big)
            s0, s1 = _wal_checksum(frame[24:], s0, s1, big)
            if (s0, s1) != (f0, f1):
                break
            pending[pgno] = offset + 24
            index += 1
            if db_size:
                committed.update(pending)
                pending.clear()
                result.frames = index
                result.db_pages = db_size
        result.ignored_frames = index - result.frames
        if not committed:
            return result
        fd = os.open(db_copy, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        try:
            for pgno, at in sorted(committed.items()):
                wal.seek(at)
                os.pwrite(fd, wal.read(page_size), (pgno - 1) * page_size)
            if result.db_pages:
                os.ftruncate(fd, result.db_pages * page_size)
        finally:
            os.close(fd)
        result.pages = len(committed)
    return result
