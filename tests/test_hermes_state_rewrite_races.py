"""A rewrite built from a read never undoes what another process acknowledged after that read:
not only rows appended since (``seen_through_id``), but also rewinds and restores of rows the
read already covered. Such a rewrite is refused with ``RewriteRefusedError``; the caller reads
again and rewrites from that read."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from conftest import RunPython
from hermes_state import RewriteRefusedError, SessionDB

OPS = ("archive_and_compact", "replace_messages")
BOUNDS = ("explicit", "remembered")

# Another process rewinds (argv[2] == "rewind") or restores session "s" of store argv[1] from
# message id argv[3], and prints what it did once it is acknowledged.
OTHER_PROCESS = """
import sys
from hermes_state import SessionDB

path, action, row_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
with SessionDB(path, rebuild_fts=False) as db:
    if action == "rewind":
        print(db.rewind_to_message("s", row_id)["rewound_count"])
    else:
        print(db.restore_rewound("s", row_id))
"""


def turn(role: str, content: str) -> dict[str, Any]:
    return {"role": role, "content": content, "message_uid": uuid.uuid4().hex}


def rewrite(db: SessionDB, op: str, messages: list[dict[str, Any]], bound: int | None) -> None:
    kwargs: dict[str, Any] = {} if bound is None else {"seen_through_id": bound}
    if op == "replace_messages":
        db.replace_messages("s", messages, active_only=True, **kwargs)
    else:
        db.archive_and_compact("s", messages, **kwargs)


def other_process(run_python: RunPython, path: Path, action: str, row_id: int) -> int:
    done = run_python(OTHER_PROCESS, str(path), action, str(row_id))
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def contents(rows: list[dict[str, Any]]) -> list[str]:
    return [r["content"] for r in rows]


def seed(db: SessionDB) -> list[int]:
    """system, u1, a1, u2, a2: the ids."""
    db.create_session("s", "cli")
    return [db.append_message("s", **turn(role, content)) for role, content in (
        ("system", "sys"), ("user", "u1"), ("assistant", "a1"), ("user", "u2"),
        ("assistant", "a2"))]


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("op", OPS)
def test_a_restore_acknowledged_after_the_read_is_not_undone(
    db: SessionDB, db_path: Path, run_python: RunPython, op: str, bound: str
) -> None:
    """u2 and a2 were rewound and a new turn written; the compactor reads; another process
    restores u2 and a2 (old ids, below the compactor's bound); the compactor's rewrite must not
    delete or archive them."""
    ids = seed(db)
    db.rewind_to_message("s", ids[3])
    db.append_message("s", **turn("user", "u3"))
    read = db.get_messages("s")
    assert contents(read) == ["sys", "u1", "a1", "u3"]
    assert other_process(run_python, db_path, "restore", ids[3]) == 2
    with pytest.raises(RewriteRefusedError, match="changed since this handle read them"):
        rewrite(db, op, [read[0], turn("user", "summary"), read[-1]],
                read[-1]["id"] if bound == "explicit" else None)
    assert contents(db.get_messages("s")) == ["sys", "u1", "a1", "u2", "a2", "u3"], \
        "the restored turns are still live"

    again = db.get_messages("s")  # the caller reads again and rewrites from that read
    rewrite(db, op, [again[0], turn("user", "summary"), *again[3:]],
            again[-1]["id"] if bound == "explicit" else None)
    assert contents(db.get_messages("s")) == ["sys", "summary", "u2", "a2", "u3"]


@pytest.mark.parametrize("bound", BOUNDS)
@pytest.mark.parametrize("op", OPS)
def test_a_rewind_acknowledged_after_the_read_is_not_undone(
    db: SessionDB, db_path: Path, run_python: RunPython, op: str, bound: str
) -> None:
    """The compactor reads; another process rewinds u2 and a2; the compactor's rewrite, which
    keeps the tail it read, must not bring the retracted turns back."""
    ids = seed(db)
    read = db.get_messages("s")
    assert other_process(run_python, db_path, "rewind", ids[3]) == 2
    with pytest.raises(RewriteRefusedError) as refused:
        rewrite(db, op, [read[0], turn("user", "summary"), *read[3:]],
                read[-1]["id"] if bound == "explicit" else None)
    assert refused.value.session_id == "s"
    assert contents(db.get_messages("s")) == ["sys", "u1", "a1"], "u2 and a2 stay rewound"
    assert db.list_recent_user_messages("s", include_inactive=True)[0]["preview"] == "u2"
    db.restore_rewound("s", ids[3])  # still restorable: nothing was archived over them
    assert contents(db.get_messages("s")) == ["sys", "u1", "a1", "u2", "a2"]


@pytest.mark.parametrize("op", OPS)
def test_the_handles_own_rewind_and_restore_need_no_new_read(db: SessionDB, op: str) -> None:
    ids = seed(db)
    db.get_messages("s")
    db.rewind_to_message("s", ids[3])
    rewrite(db, op, [turn("user", "summary")], None)
    assert contents(db.get_messages("s")) == ["summary"]
    db.restore_rewound("s", ids[3])  # rewound rows (not the compaction archive) come back
    read = db.get_messages("s")
    rewrite(db, op, [turn("user", "again")], read[-1]["id"])
    assert contents(db.get_messages("s")) == ["again"]


@pytest.mark.parametrize("op", OPS)
def test_an_append_elsewhere_after_the_read_is_still_kept_not_refused(
    db: SessionDB, db_path: Path, op: str
) -> None:
    seed(db)
    read = db.get_messages("s")
    with SessionDB(db_path, rebuild_fts=False) as other:
        other.append_message("s", **turn("user", "late"))
    rewrite(db, op, [turn("user", "summary")], read[-1]["id"])
    assert contents(db.get_messages("s")) == ["summary", "late"]
