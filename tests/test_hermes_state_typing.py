"""Type checkers see the real methods: a user's script that misspells a keyword of a
``SessionDB`` method is rejected by mypy, and the same script spelled right passes.

mypy runs as a subprocess on the modules this test imports (the checkout, or the installed
package), with imports followed silently: only the user's script is judged.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_state

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mypy") is None,
    reason="mypy is not installed (pip install -e '.[test]' brings it)",
)

# One call of each kind the facade builds: a transcript write with the compaction-bound
# memory (append_message), a read that falls back to canonical rows (search_messages), a
# plain read, a rewrite, a lenient probe and an activity stamp.
USER_SCRIPT = """
from hermes_state import SessionDB

def use(db: SessionDB) -> None:
    row_id: int = db.append_message("s", role="user", content="hello", token_count=3)
    hits: list[dict[str, object]] = db.search_messages("hello", {role_filter}=["user"], limit=5)
    rows = db.get_messages("s", include_inactive=True)
    db.replace_messages("s", rows, seen_through_id=row_id)
    state = db.get_handoff_state("s")
    db.update_session_cwd("s", "/tmp")
    print(row_id, hits, state)
"""


def run_mypy(tmp_path: Path, scripts: dict[str, str]) -> subprocess.CompletedProcess[str]:
    for name, text in scripts.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    source_dir = Path(hermes_state.__file__).resolve().parent
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-incremental", "--cache-dir", str(tmp_path / "cache"), *scripts],
        cwd=tmp_path,
        env={"MYPYPATH": str(source_dir), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_mypy_rejects_misspelled_keywords_and_passes_the_script_spelled_right(
    tmp_path: Path,
) -> None:
    wrong = USER_SCRIPT.format(role_filter="roles").replace("role=", "rol=")
    right = USER_SCRIPT.format(role_filter="role_filter")
    result = run_mypy(tmp_path, {"wrong.py": wrong, "right.py": right})

    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert all(line.startswith("wrong.py:") for line in errors), result.stdout
    assert any(line.startswith(f"wrong.py:{line_of(wrong, 'db.append_message(')}: ")
               and 'Unexpected keyword argument "rol"' in line for line in errors), result.stdout
    assert any(line.startswith(f"wrong.py:{line_of(wrong, 'db.search_messages(')}: ")
               and 'Unexpected keyword argument "roles"' in line for line in errors), result.stdout
    assert len(errors) == 2 and result.returncode == 1, result.stdout + result.stderr


def line_of(script: str, text: str) -> int:
    return next(n for n, line in enumerate(script.splitlines(), 1) if text in line)


@pytest.mark.slow
def test_mypy_shows_append_message_with_its_own_parameters(tmp_path: Path) -> None:
    result = run_mypy(tmp_path, {"reveal.py": (
        "from hermes_state import SessionDB\n"
        "def use(db: SessionDB) -> None:\n"
        "    reveal_type(db.append_message)\n"
    )})
    revealed = result.stdout.split("Revealed type is", 1)[-1].splitlines()[0]
    assert revealed.startswith(
        ' "def (session_id: str, role: str, content: str | list[Any] | dict[str, Any] | None ='
    ), (
        result.stdout
    )
    assert revealed.endswith(', tool_call_uid: str | None =) -> int"'), result.stdout
