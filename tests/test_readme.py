"""Every example of the README and of ``docs/`` runs as written, and none touches a store it
did not create: each runs with ``HOME`` and ``HERMES_HOME`` pointing at a lived-in store (old
ended sessions a prune would take, live ones, a delegate child), and every session and message
of it is still there afterwards. The README's set-up commands are the ones CI uses."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import subprocess_env

from hermes_state import SessionDB
from hermes_state_cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
CI_SCRIPT = ROOT / ".ci" / "run"
# A shell block preceded by this comment is shown, not run (it needs a network, an install,
# or runs until stopped); the reason is required.
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\n```bash\n", re.DOTALL)


def blocks(lang: str) -> list[tuple[str, str]]:
    """(name, code) of every ``lang`` block of the README and the docs, in order."""
    found = []
    for doc in DOCUMENTS:
        text = doc.read_text("utf-8")
        for n, code in enumerate(re.findall(rf"```{lang}\n(.*?)```", text, re.DOTALL)):
            found.append((f"{doc.relative_to(ROOT)} {lang} example {n + 1}", code))
    return found


def shell_blocks_run() -> list[tuple[str, str]]:
    run = []
    for doc in DOCUMENTS:
        text = doc.read_text("utf-8")
        shown = {m.end() for m in NOT_RUN.finditer(text)}
        for n, match in enumerate(re.finditer(r"```bash\n(.*?)```", text, re.DOTALL)):
            if match.start(1) not in shown:
                run.append((f"{doc.relative_to(ROOT)} shell example {n + 1}", match.group(1)))
    return run


def lived_in_store(path: Path) -> None:
    """A store with history: what an example that prunes, deletes or damages the default
    store would destroy."""
    with SessionDB(path) as db:
        for n in range(3):
            sid = f"old-{n}"
            db.create_session(sid, source="cli", started_at=float(n))  # 1970: any prune takes it
            db.append_message(sid, "user", f"an old question {n}")
            db.end_session(sid, "user_exit")
        db.create_session("sess_abc123", source="cli", model="anthropic/claude-sonnet-4.6")
        db.append_message("sess_abc123", "user", "How do I fix the Docker build?")
        db.append_message("sess_abc123", "assistant", "Pin the base image; the docker build works.")
        db.create_session("helper", source="cli", parent_session_id="sess_abc123",
                          model_config={"_delegate_from": "sess_abc123"})
        db.append_message("helper", "user", "look at the Dockerfile")
        db.create_session("empty-ended", source="tui", started_at=1.0)
        db.end_session("empty-ended", "user_exit")


def contents(path: Path) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        sessions = conn.execute(
            "SELECT id, parent_session_id, ended_at, message_count, archived FROM sessions "
            "ORDER BY id").fetchall()
        rows = conn.execute(
            "SELECT id, session_id, message_uid, content, active FROM messages ORDER BY id"
        ).fetchall()
    finally:
        conn.close()
    return sessions, rows


@pytest.fixture
def lived_in(tmp_path: Path, hermes_home: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The default store (``HERMES_HOME``) and ``~/.hermes`` both hold history; the system's
    temporary folder is one of the test's own, to be found empty afterwards."""
    user = tmp_path / "user"
    monkeypatch.setenv("HOME", str(user))
    stores = [hermes_home / "state.db", user / ".hermes" / "state.db"]
    lived_in_store(stores[0])
    stores[1].parent.mkdir(parents=True)
    # Copied with SQLite's backup API: the test guard refuses a SessionDB on ~/.hermes.
    with contextlib.closing(sqlite3.connect(stores[0])) as src, \
            contextlib.closing(sqlite3.connect(stores[1])) as dst:
        src.backup(dst)
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(system_temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    return stores


def assert_untouched(stores: list[Path], before: list[object], tmp_path: Path) -> None:
    assert [contents(s) for s in stores] == before, "an example changed a store it did not create"
    assert list((tmp_path / "system-temp").iterdir()) == [], "an example left temporary files"


def test_the_examples_are_found() -> None:
    assert len(blocks("python")) >= 10 and len(shell_blocks_run()) >= 2


@pytest.mark.parametrize("name,code", blocks("python"), ids=[n for n, _ in blocks("python")])
def test_python_example_runs_and_leaves_existing_sessions_alone(
    name: str, code: str, lived_in: list[Path], tmp_path: Path
) -> None:
    before = [contents(s) for s in lived_in]
    exec(compile(code, name, "exec"), {"__name__": "readme_example"})
    assert_untouched(lived_in, before, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name,code", shell_blocks_run(),
                         ids=[n for n, _ in shell_blocks_run()])
def test_shell_example_runs_and_leaves_existing_sessions_alone(
    name: str, code: str, lived_in: list[Path], tmp_path: Path, hermes_home: Path
) -> None:
    before = [contents(s) for s in lived_in]
    workdir = tmp_path / "work"
    workdir.mkdir()
    script = ("set -euo pipefail\n"
              f'hermes-state() {{ {shlex.quote(sys.executable)} -m hermes_state_cli "$@"; }}\n'
              + code)
    env = subprocess_env({"HERMES_HOME": str(hermes_home), "HOME": str(tmp_path / "user"),
                          "TMPDIR": str(tmp_path / "system-temp"), "COLUMNS": "100"})
    done = subprocess.run(["bash", "-c", script], cwd=workdir, env=env, check=False,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{name}:\n{done.stdout}\n{done.stderr}"
    assert_untouched(lived_in, before, tmp_path)


def test_every_shell_example_not_run_says_why() -> None:
    for doc in DOCUMENTS:
        text = doc.read_text("utf-8")
        for match in re.finditer(r"<!-- not run:(.*?)-->", text, re.DOTALL):
            assert match.group(1).strip(), f"{doc.name}: a block shown without a reason"


def test_the_command_lines_of_every_example_are_commands_the_parser_accepts() -> None:
    lines = [line for _, code in blocks("bash") for line in code.splitlines()
             if line.startswith("hermes-state ")]
    assert len(lines) >= 10
    parser = build_parser()
    for line in lines:
        argv = shlex.split(line.split(" > ")[0])[1:]  # without the shell's redirection
        parser.parse_args(argv)  # exits (and fails the test) on anything it refuses


def test_readme_gives_exactly_two_setup_commands_and_ci_runs_the_test_one() -> None:
    text = README.read_text(encoding="utf-8")
    setup = text.split("## Set-up", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```bash\n(.*?)\n```", setup, re.DOTALL)
    assert commands == [
        "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && hermes-state doctor",
        "pip install -e '.[test]' && pytest",
    ]
    ci = CI_SCRIPT.read_text(encoding="utf-8")
    assert "python3 -m venv" in ci and "pip install --quiet -e '.[test]'" in ci
    lines = ci.rstrip().splitlines()
    assert lines[-1] == "mypy --strict $modules", "the type check comes last"
    tests_run, modules_read = lines.index("pytest"), lines.index("modules=$(python - <<'EOF'")
    assert tests_run < modules_read, "the test suite runs first"
    assert '["tool"]["setuptools"]["py-modules"]' in "\n".join(lines[modules_read:])


@pytest.mark.slow
def test_the_test_command_leaves_nothing_in_the_system_temporary_folder(tmp_path: Path) -> None:
    """pytest keeps the temporary directories of its last runs in the system's temporary
    folder (gigabytes, for this suite): the suite's own go when the run ends, its workers'
    with them."""
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    outer = {key: None for key in os.environ if key.startswith("PYTEST_")}
    one_test = "tests/test_readme.py::test_the_examples_are_found"
    env = subprocess_env({**outer, "TMPDIR": str(system_temp)})
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", one_test], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
    assert list(system_temp.iterdir()) == [], "the run left its temporary files"


def anchors(doc: Path) -> set[str]:
    """The anchors a Markdown renderer gives the headings of ``doc`` (GitHub's rule)."""
    headings = re.findall(r"^#+ (.+)$", doc.read_text("utf-8"), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_the_readme_fits_and_its_links_lead_somewhere() -> None:
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    for doc in DOCUMENTS:
        for target, anchor in re.findall(r"\]\(((?!https?:)[^)#]*)(?:#([^)]+))?\)",
                                         doc.read_text("utf-8")):
            if Path(target).name == "compatibility.md":
                continue  # written beside these by its own change
            linked = doc.parent / target if target else doc
            assert linked.exists(), f"{doc.name} links to missing {target}"
            if anchor:
                assert anchor in anchors(linked), f"{doc.name} links to {target}#{anchor}"


def test_the_error_table_names_every_error_once() -> None:
    import hermes_state_errors

    section = README.read_text(encoding="utf-8").split("## Errors", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    named = [name for row in rows for name in re.findall(r"`(\w+Error)`", row.split(" | ")[0])]
    assert len(named) == len(set(named)), "an error named twice"
    declared = {name for name, value in vars(hermes_state_errors).items()
                if isinstance(value, type) and issubclass(value, Exception)
                and value.__module__ == "hermes_state_errors" and name != "HermesStateError"}
    assert declared == set(named), (sorted(declared - set(named)), sorted(set(named) - declared))
    block = section.split("| error", 1)[1].split("\n\n", 1)[0]  # the table ends at a blank line
    assert block.count("\n| `") == len(rows), "a paragraph splits the table"


def test_every_module_of_the_package_is_installed() -> None:
    """A top-level module missing from ``py-modules`` imports from a checkout but not from an
    install (the console script run elsewhere would fail)."""
    listed = set(re.findall(r'"(hermes_state\w*)"', (ROOT / "pyproject.toml").read_text()))
    present = {p.stem for p in ROOT.glob("hermes_state*.py")}
    assert present <= listed, sorted(present - listed)


def test_the_layout_names_every_module() -> None:
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    layout = api.split("## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(hermes_state\w*)`", layout))
    present = {p.stem for p in ROOT.glob("hermes_state*.py")}
    assert present == named, (sorted(present - named), sorted(named - present))
