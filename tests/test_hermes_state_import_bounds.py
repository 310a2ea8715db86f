"""An import reads its input in bounded pieces: an endless line, ``/dev/zero`` or a file of
zeros left by a crash is refused — naming the file and the line, nothing imported — within a
memory limit far below what reading it whole would take."""

from __future__ import annotations

import io
import json
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, subprocess_env
from hermes_state import ImportRejectedError, InvalidInputError, SessionDB
from hermes_state_transfer import MAX_JSON_EXPORT_BYTES, MAX_RECORD_BYTES

# The importing process may map this much address space: a few times the largest record it
# reads, far below what reading an endless input whole would take.
ADDRESS_SPACE_LIMIT = 1536 * 2**20

# Writes the header of an export, then one line that never ends (until the reader goes away).
ENDLESS_LINE = """
import json, sys
out = sys.stdout.buffer
out.write(json.dumps({"kind": "header", "format": "hermes-state-export", "format_version": 1,
                      "schema_version": 1}).encode() + b"\\n")
out.write(b'{"kind": "message", "session_id": "s", "message": {"content": "')
chunk = b"a" * 2**16
try:
    while True:
        out.write(chunk)
except (BrokenPipeError, OSError):
    pass
"""


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_LIMIT, ADDRESS_SPACE_LIMIT))


def import_cli(
    db_path: Path, source: str, *extra: str, stdin: int | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", "--db", str(db_path), "sessions", "import",
         source, *extra],
        env=subprocess_env(), stdin=stdin, capture_output=True, text=True, timeout=120,
        cwd=REPO_ROOT, preexec_fn=_limited, check=False,
    )


def assert_refused(done: subprocess.CompletedProcess[str], db_path: Path, *said: str) -> None:
    assert done.returncode == 1, done.stderr[-2000:]
    assert "MemoryError" not in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    for text in said:
        assert text in done.stderr, done.stderr[-2000:]
    assert "nothing was imported" in done.stderr
    assert not db_path.exists(), "a refused import into a new store leaves no store"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", [None, "jsonl"])
def test_dev_zero_is_refused_within_a_memory_limit(tmp_path: Path, fmt: str | None) -> None:
    db_path = tmp_path / "store" / "state.db"
    extra = () if fmt is None else ("--format", fmt)
    done = import_cli(db_path, "/dev/zero", *extra)
    if fmt == "jsonl":
        assert_refused(done, db_path, "line 1", "/dev/zero", f"longer than {MAX_RECORD_BYTES}")
    else:
        assert_refused(done, db_path, "line 1", "/dev/zero", "not JSON at line 1, column 1")


@pytest.mark.slow
def test_an_endless_line_on_stdin_is_refused_within_a_memory_limit(tmp_path: Path) -> None:
    db_path = tmp_path / "state.db"
    writer = subprocess.Popen([sys.executable, "-c", ENDLESS_LINE], stdout=subprocess.PIPE)
    try:
        done = import_cli(db_path, "-", "--format", "jsonl", stdin=writer.stdout.fileno())
    finally:
        assert writer.stdout is not None
        writer.stdout.close()
        writer.kill()
        writer.wait()
    assert_refused(done, db_path, "line 2", "<stdin>", f"longer than {MAX_RECORD_BYTES}")


@pytest.mark.slow
def test_a_file_of_zeros_left_by_a_crash_is_refused_within_a_memory_limit(
    tmp_path: Path,
) -> None:
    zeros = tmp_path / "export.jsonl"
    with zeros.open("wb") as fh:
        fh.truncate(MAX_JSON_EXPORT_BYTES + MAX_RECORD_BYTES)  # sparse: no disk used
    db_path = tmp_path / "state.db"
    done = import_cli(db_path, str(zeros))
    assert_refused(done, db_path, "line 1", str(zeros))


def stream(db: SessionDB) -> list[str]:
    return list(db.iter_export_jsonl())


def test_a_line_over_the_cap_refuses_the_import_and_names_it(db_path: Path) -> None:
    with SessionDB(db_path.with_name("source.db"), rebuild_fts=False) as source:
        source.create_session("s", "cli")
        source.append_message("s", "user", "short")
        source.append_message("s", "assistant", "x" * 5000)
        lines = stream(source)
    long_line = next(n for n, line in enumerate(lines, start=1) if "x" * 5000 in line)
    with SessionDB(db_path, rebuild_fts=False) as db:
        fp = io.StringIO("".join(lines))
        fp.name = "my-export.jsonl"  # type: ignore[misc]
        with pytest.raises(ImportRejectedError) as refused:
            db.import_jsonl(fp, max_record_bytes=4096)
        assert refused.value.errors[-1]["line"] == long_line
        assert "my-export.jsonl" in refused.value.errors[-1]["error"]
        assert fp.tell() < len("".join(lines)), "nothing after the long line was read"
        assert db.list_sessions_rich() == []
        report = db.import_jsonl(io.BytesIO("".join(lines).encode()), max_record_bytes=8192)
        assert report["imported"] == ["s"]


@pytest.mark.parametrize("bad", [0, -1, 2**64, "4096", 1.5, True])
def test_the_record_cap_must_be_a_usable_int(db: SessionDB, bad: object) -> None:
    with pytest.raises(InvalidInputError):
        db.import_jsonl(io.StringIO(""), max_record_bytes=bad)  # type: ignore[arg-type]


def test_a_json_export_is_read_whole_only_under_its_cap(tmp_path: Path) -> None:
    from hermes_state_transfer import read_json_export

    data = [{"id": "s", "messages": []}]
    assert read_json_export(io.BytesIO(json.dumps(data).encode())) == data
    assert read_json_export(io.StringIO("  \n" + json.dumps(data))) == data
    with pytest.raises(ImportRejectedError, match="longer than 10 bytes"):
        read_json_export(io.StringIO(json.dumps(data)), limit=10)
    with pytest.raises(ImportRejectedError, match="not JSON"):
        read_json_export(io.StringIO("[1, 2"))
