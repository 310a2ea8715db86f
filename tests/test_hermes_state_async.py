"""``AsyncSessionDB``: store calls awaited from an event loop, run off it."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path
from typing import Any

import pytest

from hermes_state import AsyncSessionDB, SessionDB, SessionNotFoundError, StateDbClosedError


def test_the_wrapper_exposes_the_handle_and_its_attributes(db: SessionDB) -> None:
    adb = AsyncSessionDB(db)
    assert adb._db is db
    assert getattr(adb, "_db", adb) is db, "the gateway unwraps it this way"
    assert adb.path == db.path and adb.read_only is False, "non-callables as they are"
    assert adb.closed is False
    assert inspect.iscoroutinefunction(adb.get_session)
    assert inspect.iscoroutinefunction(adb.sanitize_title)
    assert adb.get_session.__name__ == "get_session"


def test_a_missing_name_raises_attribute_error(db: SessionDB) -> None:
    adb = AsyncSessionDB(db)
    with pytest.raises(AttributeError):
        adb.no_such_method  # noqa: B018
    assert getattr(adb, "no_such_method", None) is None
    assert not hasattr(adb, "no_such_method")
    assert hasattr(adb, "update_token_counts")


def test_calls_return_and_raise_as_on_the_handle(db: SessionDB) -> None:
    async def main() -> tuple[Any, ...]:
        adb = AsyncSessionDB(db)
        await adb.create_session("s", "telegram")
        row_id = await adb.append_message("s", "user", "hello", platform_message_id="p1")
        turns = await adb.get_messages_as_conversation("s")
        found = await adb.message_count("s")
        with pytest.raises(SessionNotFoundError):
            await adb.append_message("ghost", "user", "x")
        return row_id, turns, found

    row_id, turns, found = asyncio.run(main())
    assert db.get_messages("s")[0]["id"] == row_id
    assert [t["content"] for t in turns] == ["hello"] and found == 1


def test_a_closed_handle_raises_through_the_wrapper(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.close()
    adb = AsyncSessionDB(db)
    assert adb.closed is True
    with pytest.raises(StateDbClosedError):
        asyncio.run(adb.get_session("s"))


def test_a_write_waiting_on_another_process_does_not_block_the_loop(
    db: SessionDB, db_path: Path, hold_write_lock: Any
) -> None:
    """Another process holds the write lock for a second; the awaited write waits it out (its
    patience) in a worker thread while a task on the loop keeps ticking every 10 ms."""
    db.create_session("s", "cli")
    adb = AsyncSessionDB(db)

    async def main() -> tuple[list[float], float, float]:
        ticks: list[float] = []
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0.02)
        start = time.monotonic()
        await adb.append_message("s", "user", "written after the lock is released")
        took = time.monotonic() - start
        stop.set()
        await task
        return ticks, start, took

    with hold_write_lock(db_path, seconds=1.0):
        ticks, start, took = asyncio.run(main())

    assert took >= 0.5, "the write really waited for the other process"
    during = [t for t in ticks if start <= t <= start + took]
    assert len(during) >= took / 0.01 * 0.5, f"the loop stalled: {len(during)} ticks in {took:.2f}s"
    gaps = [b - a for a, b in zip(during, during[1:])]
    assert max(gaps, default=0) < 0.3
    assert [m["content"] for m in db.get_messages("s")] == ["written after the lock is released"]
