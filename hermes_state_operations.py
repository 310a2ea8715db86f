"""The module-level API of ``hermes_state`` beside ``SessionDB``: operations on a store's files
and homes, and the names the application imports from the previous store.

Each operation is its sibling's function with its arguments checked and operating-system
failures typed (``hermes_state_arguments.operation``). ``hermes_state`` re-exports every name
listed here; the operations that need ``SessionDB`` itself (``collect_profile_stats``,
``profile_stores``) stay there.
"""

from __future__ import annotations

import hermes_state_arguments as arguments
import hermes_state_home as home_paths
import hermes_state_maintenance as maintenance
import hermes_state_openability as openability
import hermes_state_profiles as profiles
import hermes_state_recover as recover
import hermes_state_schema_sql as schema_sql
import hermes_state_search as search
import hermes_state_workspace as workspace
from hermes_state_home import get_hermes_home, hermes_home_override
from hermes_state_openability import format_session_db_unavailable, get_last_init_error
from hermes_state_profiles import ProfileStoreRegistry
from hermes_state_schema_sql import SCHEMA_VERSION
from hermes_state_wal import apply_wal_with_fallback

__all__ = [
    "apply_wal_with_fallback",
    "backup_state_db",
    "restore_state_db",
    "repair_state_db",
    "recover_state_db",
    "repair_state_db_schema",
    "format_session_db_unavailable",
    "get_last_init_error",
    "DEFAULT_DB_PATH",
    "SCHEMA_VERSION",
    "SCHEMA_SQL",
    "MAX_FTS5_QUERY_CHARS",
    "get_hermes_home",
    "hermes_home_override",
    "display_hermes_home",
    "resolve_profile_home",
    "resolve_store_home",
    "profile_config_path",
    "child_process_env",
    "ProfileStoreRegistry",
    "workspace_key",
]

backup_state_db = arguments.operation(maintenance.backup_state_db)
restore_state_db = arguments.operation(maintenance.restore_state_db)
repair_state_db = arguments.operation(maintenance.repair_state_db)
recover_state_db = arguments.operation(recover.recover_state_db)
resolve_store_home = arguments.operation(profiles.resolve_store_home)
display_hermes_home = arguments.operation(home_paths.display_hermes_home)
resolve_profile_home = arguments.operation(home_paths.resolve_profile_home)
profile_config_path = arguments.operation(home_paths.profile_config_path)
child_process_env = arguments.operation(home_paths.child_process_env)
workspace_key = arguments.operation(workspace.workspace_key)
repair_state_db_schema = arguments.operation(openability.repair_state_db_schema)

#: The default store when ``hermes_state`` was imported (``SessionDB()`` resolves it at each
#: call).
DEFAULT_DB_PATH = home_paths.default_db_path()

# --- names the application imports from the previous store (see docs/compatibility.md) -----

#: The schema a new store is created with (tables, indexes, the FTS indexes and their
#: triggers), as one script of complete statements.
SCHEMA_SQL = schema_sql.SCHEMA_SQL
#: The longest search query read: longer input is cut to this many characters.
MAX_FTS5_QUERY_CHARS = search.MAX_INPUT_CHARS
