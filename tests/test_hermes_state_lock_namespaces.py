"""A compression lock is reclaimed from a holder only when its end is provable: a live holder in
another PID namespace keeps its lock (its pid names another process, or none, here), and in
the same namespace a pid whose start time differs from the recorded one was reused.

The namespace case runs a real holder under ``unshare --pid --fork`` (skipped where that is
not allowed); the holder forks until it has a pid that no process of this namespace has, the
case where a pid alone wrongly "proves" the holder gone.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hermes_state import SessionDB
from hermes_state_compression import holder_is_gone, lock_holder_name

# In a fresh PID namespace: fork until a child has pid argv[3] (absent in the caller's
# namespace); that child takes the lock of session argv[2] on the store argv[1], prints its
# holder string and waits for stdin to close.
_NAMESPACED_HOLDER = textwrap.dedent(
    """
    import os, sys
    target = int(sys.argv[3])
    while True:
        pid = os.fork()
        if pid == 0:
            if os.getpid() != target:
                os._exit(0)
            from hermes_state import SessionDB
            from hermes_state_compression import lock_holder_name
            with SessionDB(sys.argv[1]) as db:
                holder = lock_holder_name("namespaced")
                assert db.try_acquire_compression_lock(sys.argv[2], holder, ttl_seconds=300)
            print(holder, flush=True)
            sys.stdin.read()
            os._exit(0)
        os.waitpid(pid, 0)
        if pid >= target:
            break
    """
)


def _unshare_works() -> bool:
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    probe = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", "true"],
                           capture_output=True, timeout=10)
    return probe.returncode == 0


def _absent_pid(start: int) -> int:
    """A small pid no process of this namespace has now, at or above ``start``."""
    for pid in range(start, start + 500):
        if not Path(f"/proc/{pid}").exists():
            return pid
    pytest.skip("no free small pid")


@pytest.mark.slow
@pytest.mark.parametrize("start", [40, 120, 260])
def test_a_live_holder_in_another_pid_namespace_keeps_its_lock(
    db_path: Path, start: int
) -> None:
    if not _unshare_works():
        pytest.skip("unshare --pid is not available here")
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
    target = _absent_pid(start)
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c",
         _NAMESPACED_HOLDER, str(db_path), "s1", str(target)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert proc.stdout is not None
        holder = proc.stdout.readline().strip()
        assert f"pid={target} " in holder, holder
        assert not holder_is_gone(holder), "alive in another namespace: nothing is proven"
        with SessionDB(db_path) as db:
            assert db.get_compression_lock_holder("s1") == holder
            assert not db.try_acquire_compression_lock("s1", lock_holder_name("host side"))
        assert "pidns=" in holder
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=20)
        assert proc.stdout is not None
        proc.stdout.close()


def _namespace() -> str:
    holder = lock_holder_name()
    marks = dict(part.split("=", 1) for part in holder.split() if "=" in part)
    if "pidns" not in marks or "start" not in marks:
        pytest.skip("no /proc PID namespace here")
    return marks["pidns"]


def test_in_the_same_namespace_a_reused_pid_is_gone_and_a_live_one_holds(
    db: SessionDB,
) -> None:
    pidns = _namespace()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host = socket.gethostname()
        with open(f"/proc/{sleeper.pid}/stat") as fh:
            started = fh.read().rsplit(")", 1)[1].split()[19]
        live = f"host={host} pid={sleeper.pid} pidns={pidns} start={started} worker"
        reused = f"host={host} pid={sleeper.pid} pidns={pidns} start={int(started) + 1} old"
        assert not holder_is_gone(live)
        assert holder_is_gone(reused), "the pid is another process now"
        assert db.try_acquire_compression_lock("s1", reused)
        assert db.get_compression_lock_holder("s1") is None  # provably gone: reclaimable
        assert db.try_acquire_compression_lock("s1", live)
        assert not db.try_acquire_compression_lock("s1", "someone else")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert holder_is_gone(live), "the pid is absent now"


def test_an_old_holder_string_is_judged_by_its_pid_alone(db: SessionDB) -> None:
    assert not holder_is_gone(f"host={socket.gethostname()} pid={os.getpid()} old format")
    other = f"host={socket.gethostname()} pid={os.getpid()} pidns=1 start=1 elsewhere"
    assert not holder_is_gone(other), "another namespace: never provable from here"
