"""The command line's shape, run in subprocesses on real stores: ``--version``, help and
defaults on every option, ``-n``, tables with a header row cut to ``COLUMNS`` (CJK two columns
wide), times with their zone, ``stats`` and ``doctor`` in words, ``show --tail``, values checked
before anything is opened, the search filters and ``sessions list --format``."""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import hermes_state
from conftest import subprocess_env
from state_helpers import as_json, columns
from hermes_state import SessionDB
from hermes_state_cli import build_parser
from hermes_state_cli_sessions import LIST_CSV_FIELDS

REPO_ROOT = Path(__file__).resolve().parent.parent
TITLES = [
    "東京タワーへの行き方と deploy の手順",
    "Plain ASCII title that is rather long for any terminal column, surely",
    "混在 mixed 한국어 제목 and café au lait",
    "絵文字 👍🏽 and ✌️ in a title 東京",
    "short",
]


def cli(*args: str, env: dict[str, str] | None = None,
        stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hermes_state_cli", *args],
                          env=subprocess_env(env or {}), input=stdin, capture_output=True,
                          text=True, timeout=120, cwd=REPO_ROOT)


@pytest.fixture
def titled(db_path: Path) -> list[str]:
    """Five conversations with mixed CJK/Latin titles and messages a minute apart."""
    base = time.time() - 3600
    ids = []
    with SessionDB(db_path) as db:
        for n, title in enumerate(TITLES):
            sid = f"conv-{n}"
            db.create_session(sid, "telegram" if n % 2 else "cli", model="model-a")
            db.set_session_title(sid, title)
            for i, role in enumerate(("user", "assistant", "tool", "user")):
                db.append_message(sid, role, f"needle {n}.{i} 東京 " + "word " * 30,
                                  tool_name="terminal" if role == "tool" else None,
                                  timestamp=base + 60 * (4 * n + i))
            db.update_token_counts(sid, 1000, 500, model="model-a",
                                   estimated_cost_usd=0.123456)
            ids.append(sid)
    return ids


def test_version_names_the_package_and_sqlite() -> None:
    shown = cli("--version")
    assert shown.returncode == 0
    assert shown.stdout.startswith(f"hermes-state {hermes_state.__version__} (SQLite ")


def _options(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, Any, str]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _options(sub, f"{path} {name}")
        elif (action.option_strings and action.dest not in ("help", "version")
              and action.help != argparse.SUPPRESS):  # a deprecated spelling, kept hidden
            formatter = parser._get_formatter()
            found.append((f"{path} {action.option_strings[0]}", action,
                          formatter._expand_help(action) if action.help else ""))
    return found


def test_every_option_has_help_and_every_value_states_its_default() -> None:
    options = _options(build_parser())
    assert len(options) > 60
    for name, action, text in options:
        assert text.strip(), f"{name} has no help"
        if action.nargs != 0:
            assert "default" in text, f"{name}: {text!r}"
    helps = {name.strip(): text for name, _, text in options}
    assert "(default: 20)" in helps["sessions list --limit"]
    assert "(default: table;" in helps["sessions list --format"]
    assert "(default: relevance)" in helps["sessions search --sort"]
    assert "(default: 90)" in helps["sessions prune --older-than-days"]
    assert "(default: all)" in helps["sessions show --tail"]


@pytest.mark.parametrize("width", [64, 80, 101, 160])
def test_list_has_a_header_row_and_cuts_titles_to_the_terminal_width(
    titled: list[str], width: int
) -> None:
    shown = cli("sessions", "list", env={"COLUMNS": str(width)})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["ID", "LAST", "ACTIVE", "SOURCE", "MSGS", "TITLE"]
    assert len(lines) == 1 + len(titled)
    title_at = lines[0].index("TITLE")  # the header is ASCII: its index is its column
    for line in lines:
        assert columns(line) <= width, (width, line)
    cut = 0
    for line in lines[1:]:
        title = TITLES[int(line.split()[0].split("-")[1])]
        shown_title = line[_column_start(line, title_at):]
        if shown_title != title:
            cut += 1
            assert shown_title.endswith("...") and title.startswith(shown_title[:-3].rstrip())
        assert line.split()[5] == "4"  # id, date, time, offset, source, count
    assert cut if width <= 101 else not cut


def _column_start(line: str, header_columns: int) -> int:
    """The character index where the cell under the header's column ``header_columns``
    starts (wide characters earlier in the line count twice)."""
    used = 0
    for index, ch in enumerate(line):
        if used >= header_columns:
            return index
        used += columns(ch)
    return len(line)


def test_search_has_a_header_row_and_cuts_snippets_to_the_width(titled: list[str]) -> None:
    shown = cli("sessions", "search", "needle", "-n", "3", env={"COLUMNS": "120"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "TIME", "SOURCE", "ROLE", "MATCH"]
    assert len(lines) == 4 and all(columns(line) <= 120 for line in lines)
    assert all(line.endswith("...") and ">>>needle<<<" in line for line in lines[1:])


@pytest.mark.parametrize("width", [60, 80, 90])
def test_a_narrow_search_puts_each_snippet_on_its_own_line(
    titled: list[str], width: int
) -> None:
    shown = cli("sessions", "search", "needle", "-n", "3", env={"COLUMNS": str(width)})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == ["SESSION", "TIME", "SOURCE", "ROLE"]
    assert len(lines) == 7 and all(columns(line) <= width for line in lines)
    for head, snippet in zip(lines[1::2], lines[2::2], strict=True):
        assert head.startswith("conv-") and snippet.startswith("  ")
        assert ">>>needle<<<" in snippet and snippet.endswith("...")


def test_times_are_local_with_their_offset(titled: list[str]) -> None:
    for zone, offset in (("XST-9", "+09:00"), ("YST+3:30", "-03:30"), ("UTC0", "+00:00")):
        shown = cli("sessions", "list", "-n", "1", env={"TZ": zone, "COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        row = shown.stdout.splitlines()[1]
        assert f" {offset} " in row, (zone, row)
    tokyo = cli("sessions", "show", "conv-0", env={"TZ": "XST-9"}).stdout
    utc = cli("sessions", "show", "conv-0", env={"TZ": "UTC0"}).stdout
    first = [line.split() for line in (tokyo, utc) for line in line.splitlines()
             if line.startswith("[")]  # [id] role date time offset: text
    assert first[0][4] == "+09:00:" and first[4][4] == "+00:00:"
    assert (int(first[0][3][:2]) - int(first[4][3][:2])) % 24 == 9


def test_list_formats_give_the_same_rows(titled: list[str]) -> None:
    rows = as_json(cli("sessions", "list", "--json"))
    assert as_json(cli("sessions", "list", "--format", "json")) == rows
    jsonl = cli("sessions", "list", "--format", "jsonl")
    assert [json.loads(line) for line in jsonl.stdout.splitlines()] == rows
    table = cli("sessions", "list", "--format", "csv")
    parsed = list(csv.DictReader(io.StringIO(table.stdout)))
    assert list(parsed[0]) == list(LIST_CSV_FIELDS)
    assert [r["id"] for r in parsed] == [r["id"] for r in rows]
    assert [r["title"] for r in parsed] == [r["title"] for r in rows]
    assert [float(r["last_active"]) for r in parsed] == [r["last_active"] for r in rows]
    assert len(as_json(cli("sessions", "list", "-n", "2", "--offset", "1", "--json"))) == 2


def test_stats_and_doctor_speak_plain_words(titled: list[str]) -> None:
    stats = cli("sessions", "stats")
    assert stats.returncode == 0, stats.stderr
    assert "sessions: 5" in stats.stdout and "messages: 20" in stats.stdout
    assert "tokens: 5,000 in, 2,500 out" in stats.stdout
    assert "estimated cost: $0.62" in stats.stdout and "actual cost: unknown" in stats.stdout
    assert "$0.62" in stats.stdout.splitlines()[-1]  # the by-model table, rounded
    doctor = cli("doctor")
    assert doctor.returncode == 0, doctor.stdout
    assert "quick check: ok" in doctor.stdout and "quarantine: none" in doctor.stdout
    assert "search index: ok" in doctor.stdout
    everyone = cli("sessions", "stats", "--all-profiles")
    assert "default: 5 sessions, 20 messages, estimated cost $0.62" in everyone.stdout
    for text in (stats.stdout, doctor.stdout, everyone.stdout):
        for python_repr in ("{", "}", "[", "None", "True", "False", "0o6", "0.123"):
            assert python_repr not in text, (python_repr, text)


def test_show_tail_shows_the_last_messages(titled: list[str]) -> None:
    def ids(*args: str) -> list[int]:
        shown = cli("sessions", "show", "conv-2", *args)
        assert shown.returncode == 0, shown.stderr
        return [int(line[1:line.index("]")]) for line in shown.stdout.splitlines()
                if line.startswith("[")]

    every = ids()
    assert every == [1, 2, 3, 4]  # numbered within the session, not by store-wide row id
    assert ids("--tail", "2") == [3, 4] and ids("--tail", "0") == []
    assert ids("--tail", "99") == every
    shown = as_json(cli("sessions", "show", "conv-2", "--tail", "1", "--json"))
    assert [m["content"].split()[1] for m in shown["messages"]] == ["2.3"]
    assert "messages: 4 (the last 2)" in cli("sessions", "show", "conv-2", "--tail", "2").stdout


@pytest.mark.parametrize(("args", "message"), [
    (["sessions", "list", "-n", "-1"], "argument --limit/-n: must be 0 or more, got -1"),
    (["sessions", "list", "--limit", "ten"], "expected a whole number, got 'ten'"),
    (["sessions", "list", "--offset", "-5"], "argument --offset: must be 0 or more"),
    (["sessions", "list", "--limit", str(2**64)], "must be at most"),
    (["sessions", "search", "x", "-n", "-3"], "argument --limit/-n: must be 0 or more"),
    (["sessions", "show", "x", "--tail", "-2"], "argument --tail: must be 0 or more"),
    (["sessions", "prune", "--older-than-days", "-1"], "must be 0 or more, got -1"),
    (["sessions", "prune", "--older-than-days", "nan"], "expected a number of days"),
    (["sessions", "prune", "--older-than-days", "inf"], "expected a number of days"),
    (["sessions", "search", "x", "--role", "admin"], "argument --role: invalid choice"),
    (["sessions", "search", "x", "--sort", "random"], "argument --sort: invalid choice"),
    (["sessions", "list", "--format", "xml"], "argument --format: invalid choice"),
    (["sessions", "list", "--json", "--format", "csv"], "--json and --format csv ask for"),
])
def test_bad_values_are_refused_before_anything_is_opened(
    hermes_home: Path, args: list[str], message: str
) -> None:
    refused = cli(*args)
    assert refused.returncode == 2
    assert message in refused.stderr and "Traceback" not in refused.stderr
    assert list(hermes_home.iterdir()) == []


def test_search_filters_and_sorts_through_the_command_line(
    titled: list[str], db_path: Path
) -> None:
    def search(*args: str) -> list[dict[str, Any]]:
        return as_json(cli("sessions", "search", "needle", "--json", "-n", "50", *args))

    assert {h["source"] for h in search("--source", "telegram")} == {"telegram"}
    assert {h["role"] for h in search("--role", "user", "--role", "tool")} == {"user", "tool"}
    newest = search("--sort", "newest")
    assert len(newest) == 20
    assert [h["timestamp"] for h in newest] == sorted((h["timestamp"] for h in newest),
                                                      reverse=True)
    oldest = search("--sort", "oldest", "-n", "3")
    assert [h["id"] for h in oldest] == [h["id"] for h in reversed(newest)][:3]
    with SessionDB(db_path) as db:
        last_turn = [m["id"] for m in db.get_messages("conv-0") if m["role"] == "user"][-1]
        db.rewind_to_message("conv-0", last_turn)
    assert last_turn not in {h["id"] for h in search()}  # a rewound turn is left out...
    assert len(search()) == 19
    assert last_turn in {h["id"] for h in search("--include-inactive")}  # ...unless asked
