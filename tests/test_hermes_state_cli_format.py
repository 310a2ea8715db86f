"""The command line's text output: width-aware cutting (CJK two columns wide, never inside a
character), tables that fit the terminal, one-line safe text, times with their zone."""

from __future__ import annotations

import os
import time
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_cli_format as fmt

# Latin, accents given as combining marks, CJK, full-width forms, emoji with a joiner or a
# variation selector, control characters and bidi overrides: what stored text can hold.
PIECES = ["a", "Z", " ", "e\u0301", "東", "京", "タ", "한", "Ｗ", "👍", "👨\u200d👩", "✌\ufe0f",
          "\t", "\n", "\x1b[2J", "\u202e", "\u200b", "-", "…"]
texts = st.lists(st.one_of(st.sampled_from(PIECES), st.text(max_size=3)), max_size=40).map(
    "".join)


def columns(text: str) -> int:
    """Terminal columns, counted here from unicodedata alone."""
    total = 0
    for ch in text:
        if unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf"):
            continue
        total += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return total


def starts_a_character(text: str, index: int) -> bool:
    """Whether ``text`` may be cut before ``index``: not before a zero-width mark, not after a
    zero-width joiner."""
    if index >= len(text):
        return True
    ch = text[index]
    zero = unicodedata.combining(ch) or unicodedata.category(ch) in ("Mn", "Me", "Cf")
    return not zero and (index == 0 or text[index - 1] != "\u200d")


@settings(max_examples=400, deadline=None)
@given(text=texts, width=st.integers(min_value=0, max_value=60))
def test_a_cut_is_never_wider_than_its_column_and_never_splits_a_character(
    text: str, width: int
) -> None:
    flat = fmt.flatten(text)
    out = fmt.cut(text, width)
    assert columns(out) <= width
    if columns(flat) <= width:
        assert out == flat
        return
    kept = out[:-len(fmt.MARKER)] if out.endswith(fmt.MARKER) and width > 3 else out
    assert flat.startswith(kept)
    assert starts_a_character(flat, len(kept)) or flat[len(kept)] == " "
    if width > len(fmt.MARKER):
        assert out.endswith(fmt.MARKER)


@settings(max_examples=200, deadline=None)
@given(before=texts, match=st.sampled_from(["needle", "東京", "ERESOLVE", "e\u0301t\u00e9"]),
       after=texts, width=st.integers(min_value=0, max_value=80))
def test_a_cut_around_a_match_keeps_it_in_view_and_fits(
    before: str, match: str, after: str, width: int
) -> None:
    text = f"{before}>>>{match}<<<{after}"
    out = fmt.cut_around(text, width)
    assert columns(out) <= width
    marked = f">>>{fmt.flatten(match)}<<<"
    if width >= columns(marked) + 2 * len(fmt.MARKER):  # room for the match and two cuts
        assert marked in out
    flat = fmt.flatten(text)
    if columns(flat) <= width:
        assert out == flat
    else:  # what is shown is a run of the text, with a marker on each side that was cut
        core = out.removeprefix(fmt.MARKER).removesuffix(fmt.MARKER).strip()
        assert core in flat


@settings(max_examples=200, deadline=None)
@given(text=texts)
def test_flattened_text_is_one_line_that_cannot_drive_the_terminal(text: str) -> None:
    flat = fmt.flatten(text)
    assert "\n" not in flat and "\x1b" not in flat and "  " not in flat
    assert not any(unicodedata.category(ch) in ("Cc", "Cs") for ch in flat)
    assert not any(unicodedata.category(ch) == "Cf" and ch != "\u200d" for ch in flat)
    assert flat == flat.strip()


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(st.tuples(st.text(alphabet="abcdef0123456789-", min_size=1, max_size=12),
                            texts, st.integers(0, 10**6), texts), max_size=8),
    width=st.integers(min_value=45, max_value=140),
)
def test_a_table_fits_the_width_whenever_its_uncut_columns_do(
    rows: list[tuple[str, str, int, str]], width: int
) -> None:
    cols = (fmt.Column("ID", keep=True), fmt.Column("SOURCE", max_width=12),
            fmt.Column("MSGS", align=">", keep=True), fmt.Column("TITLE", flex=True))
    lines = fmt.table(cols, rows, width)
    assert len(lines) == len(rows) + 1 and lines[0].split() == ["ID", "SOURCE", "MSGS", "TITLE"]
    for line in lines:
        assert columns(line) <= width, line
    for line, row in zip(lines[1:], rows, strict=True):
        assert line.startswith(row[0])  # an id is never cut
        assert f" {row[2]}" in line


def test_cjk_counts_two_columns_and_is_cut_between_characters() -> None:
    assert fmt.display_width("東京タワーabc") == 13
    assert fmt.cut("東京タワーへ行く", 9) == "東京タ..."
    assert fmt.cut("東京タワーへ行く", 10) == "東京タ..."  # no room for half of ワ
    assert fmt.cut("cafe\u0301 au lait", 7) == "cafe\u0301..."  # the accent stays
    assert fmt.cut("abc", 2) == "ab" and fmt.cut("東京", 1) == ""


def test_pad_counts_columns_not_characters() -> None:
    assert fmt.pad("東京", 6) == "東京  " and fmt.pad("7", 3, ">") == "  7"


def test_times_carry_their_utc_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "XST-9")  # a POSIX zone nine hours ahead of UTC
    time.tzset()
    try:
        assert fmt.when(0) == "1970-01-01 09:00 +09:00"
        monkeypatch.setenv("TZ", "YST+5:30")
        time.tzset()
        assert fmt.when(0) == "1969-12-31 18:30 -05:30"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert fmt.when(None) == "-" and fmt.when("x") == "-" and fmt.when(True) == "-"
    assert fmt.when(10.0**20) == "-"


def test_money_counts_and_plurals_read_as_words() -> None:
    assert fmt.money(0.123456) == "$0.12" and fmt.money(1234.5) == "$1,234.50"
    assert fmt.money(0.001) == "<$0.01" and fmt.money(0) == "$0.00"
    assert fmt.money(None) == "-" and fmt.money(None, "unknown") == "unknown"
    assert fmt.plural(1, "session") == "1 session" and fmt.plural(1200, "message") == \
        "1,200 messages"
    assert fmt.counts({"sessions": 3, "messages": 51000}) == "sessions 3, messages 51,000"


def test_the_terminal_width_is_columns_when_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "57")
    assert fmt.terminal_width() == 57
    monkeypatch.delenv("COLUMNS")
    assert fmt.terminal_width() == (os.get_terminal_size().columns
                                    if os.isatty(1) else 80)
