"""Writers of other processes get their turn beside writers that commit back to back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import subprocess_env

from hermes_state import SessionDB, Timing

# argv: db, session id, go file, seconds, pause between writes. Waits for the go file, then
# appends for the given seconds with a patience of 2 s, and prints what it was acknowledged
# and refused.
_WRITER = r"""
import json, sys, time
from pathlib import Path
from hermes_state import SessionDB, StateDbLockedError, Timing
path, sid, go, seconds, pause = sys.argv[1:6]
db = SessionDB(path, timing=Timing(write_patience_s=2.0, transcript_patience_s=2.0))
db.create_session(sid, "cli")
print("ready", flush=True)
while not Path(go).exists():
    time.sleep(0.005)
acked, refused, waits = [], 0, []
end = time.monotonic() + float(seconds)
while time.monotonic() < end:
    started = time.monotonic()
    try:
        acked.append(db.append_message(sid, "user", f"{sid} {len(acked)} " + "docker gateway deploy " * 20))
    except StateDbLockedError:
        refused += 1
    waits.append(time.monotonic() - started)
    if float(pause):  # (a busy writer does not even yield between its transactions)
        time.sleep(float(pause))
db.close()
print(json.dumps({"acked": acked, "refused": refused, "longest": max(waits)}), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("round_", [1, 2, 3])
def test_writers_beside_two_back_to_back_writers_are_never_refused(
    round_: int, db_path: Path, tmp_path: Path
) -> None:
    SessionDB(db_path).close()
    go = tmp_path / "go"
    roles = [("busy-1", "0"), ("busy-2", "0"), ("turn-taker", "0.05"), ("other-turn-taker", "0.05")]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(db_path), sid, str(go), "6", pause],
            stdout=subprocess.PIPE, text=True, env=subprocess_env(),
        )
        for sid, pause in roles
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        go.touch()
        reports = {sid: json.loads(proc.communicate(timeout=120)[0].splitlines()[-1])
                   for (sid, _), proc in zip(roles, procs)}
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    for sid, report in reports.items():
        assert report["refused"] == 0, (sid, report["refused"], report["longest"])
    assert all(len(report["acked"]) >= 3 for report in reports.values())
    with SessionDB(db_path, read_only=True) as db:
        for sid, report in reports.items():
            assert [m["id"] for m in db.get_messages(sid)] == report["acked"], sid
