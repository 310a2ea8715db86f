"""pytest plugin (``pytest11``): the ``live_system_guard_bypass`` marker of
``hermes_state_testguard``, for tests that must open a live store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import hermes_state_testguard

__all__ = ["MARKER", "pytest_configure", "pytest_runtest_protocol"]

MARKER = "live_system_guard_bypass"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}: let this test open the production state.db (bypasses the isolation guard)",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Lift the guard for the whole protocol of a marked test: setup, call and teardown."""
    bypass = item.get_closest_marker(MARKER) is not None
    with hermes_state_testguard.bypassed_in_process(bypass):
        yield
