"""How the command line prints: tables cut to the terminal's width, local times, counts and
costs in words, and the reports built from them.

Width is counted in terminal columns: wide East Asian characters take two, combining marks
none. Cuts fall between clusters, so an accent or emoji sequence is never split. Stored text
is shown on one line, with control and bidi characters removed, so a message cannot move the
cursor or reorder the screen."""

from __future__ import annotations

import datetime
import math
import shutil
import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hermes_state_quarantine import describe_marker

__all__ = [
    "Column",
    "char_width",
    "display_width",
    "flatten",
    "cut",
    "cut_around",
    "pad",
    "table",
    "terminal_width",
    "when",
    "money",
    "plural",
    "size",
    "check_findings",
    "counts",
    "session_table",
    "hit_table",
    "doomed_table",
    "stats_lines",
    "doctor_lines",
    "MARKER",
]

MARKER = "..."
# How search snippets mark a match (hermes_state_search's markers).
MATCH_START, MATCH_END = ">>>", "<<<"
# Below this many columns for its snippet, a search hit's snippet goes on a line of its own.
MIN_MATCH_WIDTH = 40
ZERO_WIDTH_JOINER = "\u200d"
# A flexible column is never cut narrower than this (or than its header).
MIN_FLEX_WIDTH = 10
GAP = "  "


def char_width(ch: str) -> int:
    """Terminal columns of one character: 0 for combining marks and format characters, 2 for
    wide and full-width characters, else 1."""
    if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
        return 0
    return 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1


def display_width(text: str) -> int:
    return sum(char_width(ch) for ch in text)


def _shown(ch: str) -> str:
    category = unicodedata.category(ch)
    if category == "Cc":
        return " "
    if category == "Cs":
        return "\ufffd"
    if category == "Cf" and ch != ZERO_WIDTH_JOINER:
        return ""
    return ch


def flatten(value: Any) -> str:
    """``value`` as one line of safe text (None is empty)."""
    text = "" if value is None else str(value)
    if not text.isascii() or not text.isprintable():
        text = "".join(_shown(ch) for ch in text)
    return " ".join(text.split())


def _clusters(text: str) -> Iterator[tuple[str, int]]:
    """(cluster, width) pairs: each character with the zero-width characters after it, and
    what a zero-width joiner joins."""
    cluster, width, joined = "", 0, False
    for ch in text:
        w = char_width(ch)
        if cluster and (w == 0 or joined):
            cluster += ch
            width += w
        else:
            if cluster:
                yield cluster, width
            cluster, width = ch, w
        joined = ch == ZERO_WIDTH_JOINER
    if cluster:
        yield cluster, width


def cut(value: Any, width: int) -> str:
    """:func:`flatten` of ``value``, cut to at most ``width`` columns between clusters; a cut
    ends with ``...`` when the column has room for it."""
    text = flatten(value)
    if display_width(text) <= width:
        return text
    marker = MARKER if width > len(MARKER) else ""
    return _head(text, width - len(marker)).rstrip() + marker


def _head(text: str, width: int) -> str:
    """The longest start of ``text`` at most ``width`` columns wide, cut between clusters."""
    kept, used = [], 0
    for cluster, w in _clusters(text):
        if used + w > width:
            break
        kept.append(cluster)
        used += w
    return "".join(kept)


def _tail(text: str, width: int) -> str:
    """The longest end of ``text`` at most ``width`` columns wide, cut between clusters."""
    clusters = list(_clusters(text))
    kept, used = [], 0
    for cluster, w in reversed(clusters):
        if used + w > width:
            break
        kept.append(cluster)
        used += w
    return "".join(reversed(kept))


def cut_around(value: Any, width: int, start: str = MATCH_START, end: str = MATCH_END) -> str:
    """:func:`flatten` of ``value`` cut to at most ``width`` columns around its first marked
    match (``start``...``end``), which stays in the middle of what is shown: a snippet whose
    match lies far into it still shows the match. ``...`` marks each side that was cut. Text
    without a mark is cut like :func:`cut`."""
    text = flatten(value)
    at = text.find(start)
    if display_width(text) <= width or at < 0:
        return cut(text, width)
    stop = text.find(end, at + len(start))
    stop = len(text) if stop < 0 else stop + len(end)
    before, match, after = text[:at], text[at:stop], text[stop:]
    room = width - 2 * len(MARKER)
    if room <= display_width(match):  # the match alone fills the line: it starts the line
        lead = MARKER if before and width > 2 * len(MARKER) else ""
        return lead + cut(match + after, width - len(lead))
    spare = room - display_width(match)
    right = min(display_width(after), spare - min(display_width(before), spare // 2))
    head = _tail(before, spare - right)
    tail = _head(after, right)
    return ((MARKER + head.lstrip() if head != before else head) + match
            + (tail.rstrip() + MARKER if tail != after else tail))


def pad(text: str, width: int, align: str = "<") -> str:
    """``text`` padded with spaces to ``width`` columns (``align`` ``<`` or ``>``)."""
    fill = " " * max(width - display_width(text), 0)
    return fill + text if align == ">" else text + fill


@dataclass(frozen=True)
class Column:
    """A table column: ``flex`` takes the width the others leave (one per table), ``keep``
    is never cut (ids, times: what a person copies), ``max_width`` caps its natural width."""

    header: str
    align: str = "<"
    flex: bool = False
    keep: bool = False
    max_width: int | None = None


def terminal_width() -> int:
    """``COLUMNS`` when set, else the terminal's width, else 80."""
    return shutil.get_terminal_size((80, 24)).columns


def _widths(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    natural = []
    for i, column in enumerate(columns):
        w = max([display_width(column.header), *(display_width(r[i]) for r in rows)])
        if column.max_width is not None:
            w = min(w, max(column.max_width, display_width(column.header)))
        natural.append(w)
    widths = list(natural)
    excess = sum(widths) + len(GAP) * (len(columns) - 1) - width
    floors = [
        w if c.keep else min(w, max(display_width(c.header), MIN_FLEX_WIDTH if c.flex else 0))
        for c, w in zip(columns, natural, strict=True)
    ]
    # The flexible column gives way first, then the widest of the others, a column at a time.
    order = sorted(range(len(columns)), key=lambda i: (not columns[i].flex, -natural[i]))
    for i in order:
        if excess <= 0:
            break
        take = min(excess, widths[i] - floors[i])
        widths[i] -= take
        excess -= take
    return widths


def table(
    columns: Sequence[Column], rows: Sequence[Sequence[Any]], width: int | None = None
) -> list[str]:
    """A header row and one line per row, each at most ``width`` columns (default: the
    terminal's) unless the columns that are never cut are wider on their own."""
    width = terminal_width() if width is None else width
    cells = [[flatten(value) for value in row] for row in rows]
    widths = _widths(columns, cells, width)
    lines = []
    for row in ([c.header for c in columns], *cells):
        parts = [pad(cut(text, w), w, c.align)
                 for c, text, w in zip(columns, row, widths, strict=True)]
        lines.append(GAP.join(parts).rstrip())
    return lines


def when(ts: Any) -> str:
    """An epoch time as local time with its UTC offset (``2025-07-01 23:03 +09:00``)."""
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return "-"
    try:
        moment = datetime.datetime.fromtimestamp(ts).astimezone()
    except (OverflowError, OSError, ValueError):
        return "-"
    offset = moment.strftime("%z")
    return f"{moment:%Y-%m-%d %H:%M} {offset[:3]}:{offset[3:]}"


def money(value: Any, unknown: str = "-") -> str:
    """A cost in US dollars, to the cent; ``unknown`` when there is none."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
        return unknown
    if 0 < value < 0.005:
        return "<$0.01"
    return f"${value:,.2f}"


def size(count: int) -> str:
    """A size in bytes in the largest unit that keeps a whole number in front (``178.2 MB``,
    decimal units as ``ls -h --si`` and disk tools' labels)."""
    value = float(count)
    for unit in ("bytes", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{count:,} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    raise AssertionError("unreachable")


def plural(count: int, noun: str) -> str:
    """``1 session``, ``3 sessions``, with thousands separators."""
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def counts(mapping: Mapping[str, Any] | None) -> str:
    """Row counts as ``sessions 3, messages 51``."""
    if not mapping:
        return "-"
    return ", ".join(
        f"{name} {value:,}" if isinstance(value, int) else f"{name} {flatten(value)}"
        for name, value in mapping.items()
    )


# --- the commands' tables and reports --------------------------------------------------------

SESSION_COLUMNS = (
    Column("ID", keep=True),
    Column("LAST ACTIVE", keep=True),
    Column("SOURCE", max_width=12),
    Column("MSGS", align=">", keep=True),
    Column("TITLE", flex=True),
)


# What the TITLE column shows for a session without a title.
UNTITLED = "(untitled)"


def session_table(rows: Sequence[Mapping[str, Any]], width: int | None = None) -> list[str]:
    """``sessions list``: a conversation a line, shown as its compression tip."""
    return table(SESSION_COLUMNS, [
        (r["id"], when(r.get("last_active")), r.get("source"), r.get("message_count") or 0,
         r.get("title") or UNTITLED)
        for r in rows
    ], width)


HIT_COLUMNS = (
    Column("SESSION", keep=True),
    Column("TIME", keep=True),
    Column("SOURCE", max_width=12),
    Column("ROLE", keep=True),
    Column("MATCH", flex=True),
)


def hit_table(hits: Sequence[Mapping[str, Any]], width: int | None = None) -> list[str]:
    """``sessions search``: a hit a line, its snippet in the room left, cut around the match
    so the match stays in view. When that room is narrower than :data:`MIN_MATCH_WIDTH` (an
    80-column terminal, a pipe), each hit's snippet goes on its own indented line below it,
    as wide as the line."""
    width = terminal_width() if width is None else width
    heads = [(h["session_id"], when(h.get("timestamp")), h.get("source"), h["role"])
             for h in hits]
    snippets = [h["snippet"] for h in hits]
    fixed = max(display_width(line) for line in table(HIT_COLUMNS[:4], heads, 10**6))
    room = width - fixed - len(GAP)
    if room >= MIN_MATCH_WIDTH:
        return table(HIT_COLUMNS, [(*head, cut_around(snippet, room))
                                   for head, snippet in zip(heads, snippets, strict=True)],
                     width)
    indent = "  "
    lines = table(HIT_COLUMNS[:4], heads, width)
    out = lines[:1]
    for line, snippet in zip(lines[1:], snippets, strict=True):
        out += [line, indent + cut_around(snippet, max(width - len(indent), 1))]
    return out


DOOMED_COLUMNS = (
    Column("ID", keep=True),
    Column("STARTED", keep=True),
    Column("ENDED", keep=True),
    Column("SOURCE", max_width=12),
    Column("MSGS", align=">", keep=True),
    Column("TITLE", flex=True),
)


def doomed_table(rows: Sequence[Mapping[str, Any]], width: int | None = None) -> list[str]:
    """What a ``prune`` or ``delete`` would delete, a session a line."""
    return table(DOOMED_COLUMNS, [
        (r["id"], when(r.get("started_at")), when(r.get("ended_at")), r.get("source"),
         r.get("message_count") or 0, r.get("title"))
        for r in rows
    ], width)


def stats_lines(stats: Mapping[str, Any]) -> list[str]:
    """``sessions stats``: totals, then sessions by source and usage by model."""
    archived = stats["messages_including_archived"] - stats["messages"]
    tokens = stats["tokens"]
    lines = [
        f"sessions: {stats['sessions']:,}",
        f"messages: {stats['messages']:,}"
        + (f" (and {archived:,} in archived generations)" if archived else ""),
        f"tokens: {tokens['input']:,} in, {tokens['output']:,} out, "
        f"{tokens['cache_read']:,} cache read, {tokens['cache_write']:,} cache write, "
        f"{tokens['reasoning']:,} reasoning",
        f"estimated cost: {money(stats['estimated_cost_usd'], 'unknown')}",
        f"actual cost: {money(stats['actual_cost_usd'], 'unknown')}",
    ]
    if stats["by_source"]:
        lines += ["", *table(
            (Column("SOURCE", flex=True), Column("SESSIONS", align=">", keep=True),
             Column("MESSAGES", align=">", keep=True)),
            [(r["source"], f"{r['sessions']:,}", f"{r['messages']:,}")
             for r in stats["by_source"]])]
    if stats["by_model"]:
        lines += ["", *table(
            (Column("MODEL", flex=True), Column("SESSIONS", align=">", keep=True),
             Column("TOKENS IN", align=">", keep=True),
             Column("TOKENS OUT", align=">", keep=True), Column("COST", align=">", keep=True)),
            [(r["model"], f"{r['session_count']:,}", f"{r['total_input']:,}",
              f"{r['total_output']:,}", money(r["total_cost"]))
             for r in stats["by_model"]])]
    return lines


def _fts_line(fts: Mapping[str, Any]) -> str:
    parts = []
    if fts["stale"]:
        parts.append(f"detached (fts_stale: {fts['stale']})")
    if fts["missing_triggers"]:
        parts.append(f"missing triggers: {', '.join(fts['missing_triggers'])}")
    if fts["rebuild_high_water"] is not None:
        parts.append(f"rebuilding (message id {fts['rebuild_progress']} of "
                     f"{fts['rebuild_high_water']})")
    return "; ".join(parts) or "ok"


def check_findings(rows: Sequence[str]) -> list[str]:
    """The findings of an SQLite check, one a line (SQLite puts several on one row, under a
    header line)."""
    return [line.strip() for row in rows for line in str(row).splitlines()
            if line.strip() and not line.startswith("*** in database")]


def _search_index_state(report: Mapping[str, Any]) -> str:
    """The search index's state as doctor found it: damaged tables first, then its status."""
    state = _fts_line(report["fts"])
    damaged = [t for t, error in (report.get("fts_integrity") or {}).items() if error]
    if damaged:
        state = f"damaged ({', '.join(damaged)})" + ("" if state == "ok" else f"; {state}")
    return state


def doctor_lines(report: Mapping[str, Any]) -> list[str]:
    """``doctor``'s findings in words, a line each (its problems and advice follow apart). A
    check that could not run on a damaged file is missing from the report and from here."""
    exposed = " (inside the WAL-reset bug range: see the note)" if report[
        "wal_reset_exposed"] else ""
    marker = report.get("quarantine")
    lines = [
        f"home: {report['home']}",
        f"database: {report['database']}",
        f"SQLite: {report['sqlite_version']}{exposed}",
        "files: " + "; ".join(f"{name} {mode}" for name, mode in report["files"].items()),
        f"quarantine: {describe_marker(marker) if marker else 'none'}",
    ]
    if "schema_version" in report:
        lines.append(f"schema version: {report['schema_version']}")
    if "journal_mode" in report:
        lines.append(f"journal mode: {report['journal_mode']}")
    if "quick_check" in report:
        check = report["quick_check"]
        lines.append("quick check: " + (
            "ok" if check == ["ok"] else f"{plural(len(check_findings(check)), 'problem')} found"))
    if "fts" in report:
        lines.append(f"search index: {_search_index_state(report)}")
    holders = report["in_use_by"]
    lines.append(f"in use by: {'; '.join(holders) if holders else 'none seen'}")
    return lines
