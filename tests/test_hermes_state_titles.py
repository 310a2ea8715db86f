"""Session titles: sanitising, uniqueness, lookup and lineage numbering."""

from __future__ import annotations

import pytest

from hermes_state import SessionDB, TitleConflictError


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Fix Docker Build", "Fix Docker Build"),
        ("  padded  ", "padded"),
        ("many   inner\t\tspaces\n\nand lines", "many inner spaces and lines"),
        ("nbsp\u00a0and\u2028separators\u2029too", "nbsp and separators too"),
        ("bell\x07 nul\x00 esc\x1b del\x7f c1\x9b", "bell nul esc del c1"),
        ("zero\u200bwidth\u200c join\u200d word\u2060joiner", "zerowidth join wordjoiner"),
        ("\u202eevil\u202c \u202aembed\u202b \u202doverride", "evil embed override"),
        ("\u2066isolates\u2067 \u2068first\u2069", "isolates first"),
        ("marks\u200e\u200f\u061c", "marks"),
        ("\ufeffBOM at start", "BOM at start"),
        ("日本語の タイトル 😀", "日本語の タイトル 😀"),
        ("lone\ud800 surrogate", "lone surrogate"),
        ("", None),
        ("   \t\n  ", None),
        ("\u200b\u202e\ufeff\x00", None),
        (None, None),
        ("x" * 100, "x" * 100),
        ("  " + "y" * 100 + "  ", "y" * 100),
    ],
)
def test_sanitize_title(raw: str | None, expected: str | None) -> None:
    assert SessionDB.sanitize_title(raw) == expected


def test_sanitize_title_rejects_more_than_100_characters() -> None:
    with pytest.raises(ValueError):
        SessionDB.sanitize_title("x" * 101)
    with pytest.raises(ValueError):
        SessionDB.sanitize_title("word " * 25)


def test_sanitize_title_rejects_non_strings() -> None:
    with pytest.raises(TypeError):
        SessionDB.sanitize_title(42)  # type: ignore[arg-type]


def test_set_and_get_title(db: SessionDB) -> None:
    db.create_session("s", "cli")
    assert db.get_session_title("s") is None
    assert db.set_session_title("s", "  My \u200bTitle ") is True
    assert db.get_session_title("s") == "My Title"
    assert db.get_session_by_title("My Title")["id"] == "s"
    assert db.get_session_by_title(" My  Title ")["id"] == "s"
    assert db.get_session_by_title("Other") is None
    assert db.get_session_title("missing") is None


def test_setting_a_title_on_an_unknown_session_is_false(db: SessionDB) -> None:
    assert db.set_session_title("missing", "Title") is False
    assert db.get_session_by_title("Title") is None


def test_empty_title_clears_it(db: SessionDB) -> None:
    db.create_session("s", "cli", title="Old")
    assert db.set_session_title("s", "   ") is True
    assert db.get_session_title("s") is None
    db.create_session("t", "cli")
    db.set_session_title("t", "Old")  # free again
    assert db.get_session_by_title("Old")["id"] == "t"


def test_duplicate_title_is_a_conflict(db: SessionDB) -> None:
    db.create_session("a", "cli")
    db.create_session("b", "cli")
    db.set_session_title("a", "Shared")
    with pytest.raises(TitleConflictError) as info:
        db.set_session_title("b", "  Shared ")
    assert isinstance(info.value, ValueError)
    assert db.get_session_title("b") is None
    assert db.set_session_title("a", "Shared") is True  # the owner may keep it
    db.set_session_title("b", "shared")  # titles are case-sensitive
    assert db.get_session_title("b") == "shared"


def test_a_title_given_at_creation_is_sanitised_and_unique(db: SessionDB) -> None:
    db.create_session("a", "cli", title="  Created \u200bwith\ttitle ")
    assert db.get_session_title("a") == "Created with title"
    db.create_session("b", "cli", title="Taken")
    with pytest.raises(TitleConflictError):
        db.create_session("c", "cli", title=" Taken")
    assert db.get_session("c") is None
    with pytest.raises(ValueError):
        db.create_session("d", "cli", title="x" * 101)
    assert db.get_session("d") is None
    db.create_session("e", "cli", title="\u200b ")
    assert db.get_session_title("e") is None
    # Creating an existing session again changes nothing and raises nothing.
    assert db.create_session("b", "cli", title="Created with title") == "b"
    assert db.get_session_title("b") == "Taken"


def test_untitled_sessions_do_not_conflict(db: SessionDB) -> None:
    for i in range(3):
        db.create_session(f"s{i}", "cli")
        db.set_session_title(f"s{i}", "")
    assert [db.get_session_title(f"s{i}") for i in range(3)] == [None] * 3


def test_resolve_by_title_returns_the_newest_of_the_lineage(db: SessionDB) -> None:
    db.create_session("first", "cli", started_at=100.0, title="Fix Docker Build")
    db.create_session("third", "cli", started_at=300.0, title="Fix Docker Build #3")
    db.create_session("second", "cli", started_at=200.0, title="Fix Docker Build #2")
    db.create_session("unrelated", "cli", started_at=400.0, title="Fix Docker Build Later")
    db.create_session("lookalike", "cli", started_at=500.0, title="Fix Docker Build #2 #9")
    assert db.resolve_session_by_title("Fix Docker Build") == "third"
    assert db.resolve_session_by_title("Fix Docker Build #2") == "lookalike"
    assert db.resolve_session_by_title("Nothing") is None
    assert db.resolve_session_by_title("") is None


def test_resolve_by_title_without_numbered_variants(db: SessionDB) -> None:
    db.create_session("only", "cli", title="Solo")
    assert db.resolve_session_by_title("Solo") == "only"


def test_next_title_in_lineage(db: SessionDB) -> None:
    assert db.get_next_title_in_lineage("Fresh") == "Fresh"
    db.create_session("a", "cli", title="T")
    assert db.get_next_title_in_lineage("T") == "T #2"
    db.create_session("b", "cli", title="T #2")
    assert db.get_next_title_in_lineage("T") == "T #3"
    assert db.get_next_title_in_lineage("T #2") == "T #3"
    db.create_session("c", "cli", title="T #7")
    assert db.get_next_title_in_lineage("T #3") == "T #8"
    db.create_session("d", "cli", title="T #2 extra")
    db.create_session("e", "cli", title="t #20")
    assert db.get_next_title_in_lineage("T") == "T #8"


@pytest.mark.parametrize(
    ("mine", "lookalikes"),
    [
        ("50% off_x", ["50X off_x #4", "50% offYx #5", "50%% off_x #6", "50 off_x #7"]),
        ("under_score", ["underXscore #3", "under\\score #4"]),
        ("back\\slash", ["backXslash #3", "back\\\\slash #4"]),
    ],
)
def test_lineage_wildcards_are_literal(db: SessionDB, mine: str, lookalikes: list[str]) -> None:
    db.create_session("mine", "cli", started_at=1.0, title=mine)
    for i, title in enumerate(lookalikes):
        db.create_session(f"other{i}", "cli", started_at=10.0 + i, title=title)
    assert db.get_next_title_in_lineage(mine) == f"{mine} #2"
    assert db.resolve_session_by_title(mine) == "mine"
    db.create_session("mine2", "cli", started_at=2.0, title=f"{mine} #2")
    assert db.get_next_title_in_lineage(mine) == f"{mine} #3"
    assert db.resolve_session_by_title(mine) == "mine2"


def test_a_continuation_title_can_be_set(db: SessionDB) -> None:
    db.create_session("a", "cli", title="Project")
    db.create_session("b", "cli", parent_session_id="a")
    next_title = db.get_next_title_in_lineage("Project")
    assert db.set_session_title("b", next_title) is True
    assert db.resolve_session_by_title("Project") == "b"
