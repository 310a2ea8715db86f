"""B10: what a crash of the whole machine costs with ``hermes-state replicate`` running.

Replication is asynchronous, so a machine that dies loses the commits Litestream had not yet
shipped. B9 times one message at a time from commit to replica; this benchmark measures the
window under load: 2, 3 or 4 writer processes append flat out into one store while
``hermes-state replicate`` ships it to a ``file://`` replica, then the replicator (Litestream
and its supervisor) and every writer are killed with SIGKILL at one moment, the replica is
restored into a new file, and the acknowledged rows it lacks are counted. The figure is the
age, at the kill, of the oldest acknowledged row the replica lacks: the window in which an
acknowledged turn can be lost. Each trial is a fresh store; the writers' count cycles through
2, 3, 4 and the storm lasts 3 to 5 seconds (seeded).

Run it alone with ``python -m bench --only B10`` (``--trials N`` per sync interval).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import hermes_state_replication as replication
from bench.suite import Figure, percentile, scratch_dir
from hermes_state import ReplicationError, SessionDB

__all__ = ["bench_loss_window", "loss_trial"]

# argv: db, session id, seed, go file. Once the go file exists, appends until killed; after
# each append returns it prints the row id and the (system-wide) monotonic time of the
# acknowledgement.
_WRITER = textwrap.dedent("""
    import os, random, sys, time
    from hermes_state import SessionDB
    db_path, session, seed, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = random.Random(seed)
    words = ["docker", "gateway", "東京タワー", "deploy", "서울", "pin", "base", "image"]
    with SessionDB(db_path) as db:
        db.create_session(session, "cli")
        print("ready", flush=True)
        while not os.path.exists(go):
            time.sleep(0.005)
        n = 0
        while True:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
            if rng.random() < 0.1:
                text += " " + rng.randbytes(rng.randint(1000, 6000)).hex()
            row = db.append_message(session, rng.choice(["user", "assistant"]),
                                    f"{session}-{n} {text}")
            print(row, time.monotonic(), flush=True)
            n += 1
""")

_START_TIMEOUT_S = 30.0


def _wait(predicate: Any, what: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not predicate():
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)


def _acks(out: Path) -> dict[int, float]:
    """Row id → acknowledgement time, from a writer's output (its last line may be cut)."""
    acked: dict[int, float] = {}
    for line in out.read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) == 2:
            with contextlib.suppress(ValueError):
                acked[int(parts[0])] = float(parts[1])
    return acked


def _restored_ids(binary: Path, url: str, dest: Path) -> set[int]:
    done = subprocess.run([str(binary), "restore", "-no-expand-env", "-o", str(dest), url],
                          check=False, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"litestream restore failed: {done.stderr.strip()[-300:]}")
    conn = sqlite3.connect(f"{dest.as_uri()}?mode=ro", uri=True)
    try:
        return {row for (row,) in conn.execute("SELECT id FROM messages")}
    finally:
        conn.close()


def loss_trial(binary: Path, sync_interval: str, writers: int, storm_s: float,
               seed: int) -> dict[str, Any]:
    """One crash: ``writers`` processes appending for ``storm_s`` seconds into a replicated
    store, then everything killed at once. Returns the acknowledged and lost row counts and
    ``oldest_lost_s``, the age at the kill of the oldest acknowledged row the replica lacks
    (0 when none is lost)."""
    with scratch_dir() as d:
        path, replica = d / "state.db", d / "replica"
        with SessionDB(path) as db:
            db.create_session("before", "cli")
        url = replica.as_uri()
        with (d / "replicate.log").open("w") as log:
            rep = subprocess.Popen(
                [sys.executable, "-m", "hermes_state_cli", "--db", str(path), "replicate",
                 "--to", url, "--sync-interval", sync_interval],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            )
        procs: list[subprocess.Popen[bytes]] = []
        try:
            _wait(lambda: any(replica.rglob("*.ltx")), "the replicator", rep)
            record = replication.read_record(path)
            litestream_pid = int(record["litestream_pid"]) if record else None
            for w in range(writers):
                with (d / f"w{w}").open("w") as out:
                    procs.append(subprocess.Popen(
                        [sys.executable, "-c", _WRITER, str(path), f"w{w}", str(seed * 10 + w),
                         str(d / "go")],
                        stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.DEVNULL,
                    ))
            _wait(lambda: all((d / f"w{w}").read_text().startswith("ready")
                              for w in range(writers)), "the writers")
            (d / "go").touch()  # the storm starts once every writer is ready
            time.sleep(storm_s)
            killed_at = time.monotonic()  # the machine dies: nothing more ships or commits
            if litestream_pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(litestream_pid, signal.SIGKILL)
            rep.kill()
            for proc in procs:
                proc.kill()
        finally:
            for proc in [rep, *procs]:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=60)
        acked: dict[int, float] = {}
        for w in range(writers):
            acked.update(_acks(d / f"w{w}"))
        restored = _restored_ids(binary, url, d / "restored.db")
        lost = [row for row in acked if row not in restored]
        oldest = killed_at - min(acked[row] for row in lost) if lost else 0.0
        return {"writers": writers, "storm_s": round(storm_s, 2), "acked": len(acked),
                "lost": len(lost), "oldest_lost_s": oldest}


def bench_loss_window(trials: int = 6, intervals: tuple[str, ...] = ("1s", "250ms"),
                      seed: int = 10) -> list[Figure]:
    """The oldest lost acknowledged row over ``trials`` crashes per sync interval."""
    try:
        binary = replication.find_litestream()
        replication.litestream_version(binary)
    except ReplicationError as exc:
        print(f"B10 skipped: {exc}", file=sys.stderr)
        return []
    rng = random.Random(seed)
    figures = []
    for interval in intervals:
        runs = []
        for n in range(trials):
            runs.append(loss_trial(binary, interval, 2 + n % 3, rng.uniform(3.0, 5.0),
                                   seed + n))
            print(f"B10 {interval} trial {n + 1}/{trials}: {runs[-1]}", file=sys.stderr)
        ages = [r["oldest_lost_s"] * 1e3 for r in runs]
        figures.append(Figure(
            "B10", f"oldest lost acked row, 2-4 writers + replicator killed ({interval} sync)",
            max(ages), None, "ms", None, None, "report (the worst of the trials)", None,
            {"trials": trials, "p50_ms": round(statistics.median(ages)),
             "p90_ms": round(percentile(ages, 0.9)),
             "per_trial_ms": [round(a) for a in ages],
             "writers": [r["writers"] for r in runs],
             "acked": [r["acked"] for r in runs], "lost": [r["lost"] for r in runs]},
        ))
    return figures
