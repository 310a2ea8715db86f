"""What a session runs on, switched mid-conversation: its model, its configuration and its
billing route.

The switches overwrite the session row. ``model_config`` must be a JSON object: listings read
its markers with SQLite's JSON functions, and one bad row would fail them all. A billing-route
switch clears the cached ``system_prompt``, which names the provider. An unknown id changes
nothing."""

from __future__ import annotations

import json
import sqlite3

from hermes_state_common import Text, clean_optional, clean_text, stored_text
from hermes_state_errors import InvalidInputError

__all__ = [
    "update_session_meta",
    "update_session_model",
    "update_session_billing_route",
]


def _optional_text(name: str, value: str | None) -> str | None:
    if value is not None and not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a string or None, got {value!r}")
    return clean_optional(value)


def _config_text(model_config_json: str) -> str:
    if not isinstance(model_config_json, str):
        raise InvalidInputError(
            f"model_config_json must be JSON object text, got {type(model_config_json).__name__}"
        )
    try:
        parsed = json.loads(model_config_json)
    except ValueError as exc:
        raise InvalidInputError(f"model_config_json is not JSON: {exc}") from exc
    if not isinstance(parsed, dict):
        raise InvalidInputError("model_config_json must be a JSON object")
    return clean_text(model_config_json)


UPDATE_META_SQL = """
UPDATE sessions SET model_config = ?, model = COALESCE(?, model) WHERE id = ?
"""


def update_session_meta(
    conn: sqlite3.Connection, /, session_id: str, model_config_json: str,
    model: str | None = None,
) -> None:
    """Replace ``model_config`` with the text as given; ``model`` too when not None."""
    config, new_model = _config_text(model_config_json), _optional_text("model", model)
    key = stored_text(session_id)
    if key is not None:
        conn.execute(UPDATE_META_SQL, (config, new_model, key))


UPDATE_MODEL_SQL = "UPDATE sessions SET model = ? WHERE id = ?"


def update_session_model(conn: sqlite3.Connection, /, session_id: str, model: Text) -> None:
    """Set the session's model, whatever it was; the system prompt stays."""
    new_model = _optional_text("model", model)
    key = stored_text(session_id)
    if key is not None:
        conn.execute(UPDATE_MODEL_SQL, (new_model, key))


UPDATE_ROUTE_SQL = """
UPDATE sessions SET billing_provider = ?, billing_base_url = ?,
    billing_mode = COALESCE(?, billing_mode), system_prompt = NULL
WHERE id = ?
"""


def update_session_billing_route(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    *,
    provider: Text,
    base_url: Text,
    billing_mode: Text | None = None,
) -> None:
    """Set provider and base URL (``billing_mode`` when not None) and drop the cached system
    prompt."""
    route = (_optional_text("provider", provider), _optional_text("base_url", base_url),
             _optional_text("billing_mode", billing_mode))
    key = stored_text(session_id)
    if key is not None:
        conn.execute(UPDATE_ROUTE_SQL, (*route, key))
