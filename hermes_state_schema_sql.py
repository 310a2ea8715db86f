"""The schema's text: every table, column, index, view and trigger, as named SQL constants.

It depends on nothing, so the whole schema reads in one place; ``hermes_state_schema``
applies it."""

from __future__ import annotations

__all__ = [
    "DELIVERY_OBLIGATIONS_SQL",
    "FTS_SQL",
    "FTS_TRIGGERS_SQL",
    "FTS_TRIGGER_NAMES",
    "FTS_SQL_WITHOUT_TRIGRAM",
    "FTS_TRIGGERS_SQL_WITHOUT_TRIGRAM",
    "FTS_UPDATE_OF",
    "IMPACT_DEFAULT_AVGDL",
    "INDEXES_SQL",
    "LIVE_ADMISSION_STATUSES",
    "LIVE_EXECUTION_STATUSES",
    "RUNTIME_LEDGER_TABLES",
    "SCHEMA_SQL",
    "SCHEMA_VERSION",
    "SEARCH_INDEX_SQL",
    "SEARCH_TRIGGERS_SQL",
    "SEARCH_TRIGGER_NAMES",
    "TABLES_SQL",
    "TIME_BLOCK_SHIFT",
    "sql_values",
]


# The version of the schema below; hermes_state_schema migrates older files up to it.
SCHEMA_VERSION = 31

# Canonical tables. Column additions here are picked up by _reconcile_columns() on open.
# In `sessions`, handoff_platform / handoff_error and the compression_failure_cooldown_until,
# compression_failure_error and compression_fallback_streak columns carry the previous store's
# names: the handoff and compression-state functions use them. handoff_target, handoff_at,
# compression_failure_count, last_compression_error and last_compression_failed_at are this
# library's earlier columns of other meanings; nothing here writes them, and they stay because a
# file may hold caller-set values in them.
# `async_delegations` has the previous store's shape, which the application's delegation tool
# also creates and writes with its own SQL (its INSERT names its columns); child_session_id is
# this library's one extra, nullable column. Its indexes name only the previous store's columns,
# so they hold on a table the tool created first. This library's earlier shape of the table
# (status, task, created_at) is rebuilt into this one at the next writable open.
TABLES_SQL = """
CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER NOT NULL
);

CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    source TEXT NOT NULL,
    user_id TEXT,
    model TEXT,
    model_config TEXT,
    system_prompt TEXT,
    parent_session_id TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    end_reason TEXT,
    message_count INTEGER DEFAULT 0,
    tool_call_count INTEGER DEFAULT 0,
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    billing_provider TEXT,
    billing_base_url TEXT,
    billing_mode TEXT,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    cost_status TEXT,
    cost_source TEXT,
    pricing_version TEXT,
    title TEXT,
    api_call_count INTEGER DEFAULT 0,
    session_key TEXT,
    chat_id TEXT,
    chat_type TEXT,
    thread_id TEXT,
    display_name TEXT,
    origin_json TEXT,
    expiry_finalized INTEGER DEFAULT 0,
    cwd TEXT,
    git_branch TEXT,
    git_repo_root TEXT,
    handoff_state TEXT,
    handoff_target TEXT,
    handoff_at REAL,
    handoff_platform TEXT,
    handoff_error TEXT,
    compression_failure_count INTEGER DEFAULT 0,
    last_compression_error TEXT,
    last_compression_failed_at REAL,
    compression_failure_cooldown_until REAL,
    compression_failure_error TEXT,
    compression_fallback_streak INTEGER NOT NULL DEFAULT 0,
    successor_session_id TEXT,
    profile_name TEXT,
    transport_profile TEXT,
    rewind_count INTEGER DEFAULT 0,
    archived INTEGER DEFAULT 0,
    auto_archived INTEGER DEFAULT 0,
    pinned INTEGER DEFAULT 0,
    FOREIGN KEY (parent_session_id) REFERENCES sessions(id)
);

CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id),
    role TEXT NOT NULL,
    content TEXT,
    tool_call_id TEXT,
    tool_calls TEXT,
    tool_name TEXT,
    timestamp REAL NOT NULL,
    token_count INTEGER,
    finish_reason TEXT,
    reasoning TEXT,
    reasoning_content TEXT,
    reasoning_details TEXT,
    codex_reasoning_items TEXT,
    codex_message_items TEXT,
    effect_disposition TEXT,
    platform_message_id TEXT,
    observed INTEGER DEFAULT 0,
    active INTEGER DEFAULT 1,
    compacted INTEGER DEFAULT 0,
    api_content TEXT,
    display_kind TEXT,
    display_metadata TEXT,
    message_uid TEXT,
    absorbed_message_uids TEXT,
    tool_call_uids TEXT,
    tool_call_uid TEXT,
    search_cjk TEXT
);

CREATE TABLE IF NOT EXISTS session_model_usage (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    model TEXT NOT NULL DEFAULT '',
    billing_provider TEXT NOT NULL DEFAULT '',
    billing_base_url TEXT NOT NULL DEFAULT '',
    billing_mode TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    input_tokens INTEGER DEFAULT 0,
    output_tokens INTEGER DEFAULT 0,
    cache_read_tokens INTEGER DEFAULT 0,
    cache_write_tokens INTEGER DEFAULT 0,
    reasoning_tokens INTEGER DEFAULT 0,
    estimated_cost_usd REAL,
    actual_cost_usd REAL,
    api_call_count INTEGER DEFAULT 0,
    first_used_at REAL,
    last_used_at REAL,
    PRIMARY KEY (session_id, model, billing_provider, billing_base_url, billing_mode, task)
);

CREATE TABLE IF NOT EXISTS state_meta (
    key TEXT PRIMARY KEY,
    value TEXT
);

CREATE TABLE IF NOT EXISTS gateway_routing (
    scope TEXT NOT NULL DEFAULT '',
    session_key TEXT NOT NULL,
    entry_json TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (scope, session_key)
);

CREATE TABLE IF NOT EXISTS compression_locks (
    session_id TEXT PRIMARY KEY,
    holder TEXT NOT NULL,
    acquired_at REAL NOT NULL,
    expires_at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS async_delegations (
    delegation_id TEXT PRIMARY KEY,
    origin_session TEXT NOT NULL,
    origin_ui_session_id TEXT NOT NULL DEFAULT '',
    parent_session_id TEXT,
    state TEXT NOT NULL,
    dispatched_at REAL NOT NULL,
    completed_at REAL,
    updated_at REAL NOT NULL,
    event_json TEXT,
    result_json TEXT,
    delivery_state TEXT NOT NULL DEFAULT 'pending',
    delivery_attempts INTEGER NOT NULL DEFAULT 0,
    delivered_at REAL,
    owner_pid INTEGER,
    owner_started_at INTEGER,
    task_json TEXT,
    delivery_claim TEXT,
    delivery_claimed_at REAL,
    child_session_id TEXT
);

CREATE TABLE IF NOT EXISTS runtime_epoch (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL,
    instance_id TEXT NOT NULL,
    started_at REAL NOT NULL
);

CREATE TABLE IF NOT EXISTS session_admissions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    principal_id TEXT NOT NULL DEFAULT '',
    request_id TEXT,
    intent TEXT NOT NULL DEFAULT 'queue',
    payload_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued',
    epoch INTEGER,
    outcome TEXT,
    result_json TEXT,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    UNIQUE (principal_id, session_id, request_id)
);

CREATE TABLE IF NOT EXISTS worker_executions (
    execution_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    epoch INTEGER NOT NULL,
    kind TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'registered',
    outcome TEXT,
    last_sequence INTEGER NOT NULL DEFAULT 0,
    registered_at REAL NOT NULL,
    finished_at REAL
);

CREATE TABLE IF NOT EXISTS worker_receipts (
    execution_id TEXT NOT NULL REFERENCES worker_executions(execution_id) ON DELETE RESTRICT,
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE RESTRICT,
    sequence INTEGER NOT NULL,
    payload_json TEXT NOT NULL,
    digest TEXT NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (execution_id, sequence)
);
"""

# The runtime ledgers' statuses in which work is live. The one definition: the ledgers' queries,
# their partial indexes and the deletion guard are all built from these.
LIVE_ADMISSION_STATUSES = ("queued", "started", "unknown")
LIVE_EXECUTION_STATUSES = ("registered", "running", "unknown")


def sql_values(values: tuple[str, ...]) -> str:
    """``('a', 'b')`` for a tuple of this module's own status constants (never user values)."""
    return "(" + ", ".join(f"'{v}'" for v in values) + ")"


INDEXES_SQL = f"""
CREATE INDEX IF NOT EXISTS idx_sessions_source ON sessions(source);
CREATE INDEX IF NOT EXISTS idx_sessions_parent ON sessions(parent_session_id);
CREATE INDEX IF NOT EXISTS idx_sessions_started ON sessions(started_at DESC);
CREATE INDEX IF NOT EXISTS idx_sessions_handoff_state ON sessions(handoff_state, started_at);
CREATE UNIQUE INDEX IF NOT EXISTS idx_sessions_title_unique
    ON sessions(title) WHERE title IS NOT NULL;
CREATE INDEX IF NOT EXISTS idx_messages_session ON messages(session_id, timestamp);
CREATE INDEX IF NOT EXISTS idx_messages_session_id ON messages(session_id, id);
CREATE INDEX IF NOT EXISTS idx_admissions_session
    ON session_admissions(session_id, status, id);
CREATE INDEX IF NOT EXISTS idx_worker_executions_session
    ON worker_executions(session_id, status);
CREATE INDEX IF NOT EXISTS idx_admissions_live ON session_admissions(status, epoch)
    WHERE status IN {sql_values(LIVE_ADMISSION_STATUSES)};
CREATE INDEX IF NOT EXISTS idx_worker_executions_live ON worker_executions(status, epoch)
    WHERE status IN {sql_values(LIVE_EXECUTION_STATUSES)};
CREATE INDEX IF NOT EXISTS idx_async_delegations_parent
    ON async_delegations(parent_session_id, state);
CREATE INDEX IF NOT EXISTS idx_async_delegations_delivery
    ON async_delegations(delivery_state, completed_at);
"""

# The three full-text indexes are external-content FTS5 tables over `messages` (rowid = message
# id). messages_fts covers every row; messages_fts_trigram (substring search, queried with LIKE,
# hence detail=none) skips tool output, which is most of the bytes and is still searchable by
# word through messages_fts; messages_fts_cjk indexes `search_cjk`, a copy of the row's text in
# which every CJK run is spelled as overlapping bigrams (written by Python when the row is
# inserted, NULL for rows without CJK), so plain unicode61 serves 1–2 character CJK terms and
# any SQLite, the sqlite3 shell included, can read and maintain it. The views are the exact row
# sets each index covers, so FTS5 'integrity-check' compares like with like. messages_fts names
# its content table in double quotes: that is how Datasette and sqlite-utils recognise a
# table's full-text index (`content="messages"` in its declaration), so their searches of
# `messages` go through it (to FTS5 the quotes mean the same as single ones).
FTS_SQL = """
CREATE VIEW IF NOT EXISTS messages_fts_trigram_source AS
    SELECT id, content FROM messages WHERE role <> 'tool';
CREATE VIEW IF NOT EXISTS messages_fts_cjk_source AS
    SELECT id, search_cjk FROM messages WHERE search_cjk IS NOT NULL;
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, tool_name, tool_calls,
    content="messages", content_rowid='id'
);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(
    content,
    content='messages_fts_trigram_source', content_rowid='id',
    tokenize='trigram', detail='none'
);
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_cjk USING fts5(
    search_cjk,
    content='messages_fts_cjk_source', content_rowid='id',
    tokenize='unicode61'
);
"""

FTS_TRIGGER_NAMES = ("messages_fts_insert", "messages_fts_update", "messages_fts_delete")

# A row is in the indexes unless a chunked rebuild is running and has not reached it yet:
# rows in (fts_rebuild_progress, fts_rebuild_high_water] are left to the rebuild.
_FTS_GATE = """
    (SELECT value FROM state_meta WHERE key = 'fts_rebuild_high_water') IS NULL
    OR {row}.id > (SELECT CAST(value AS INTEGER) FROM state_meta
                   WHERE key = 'fts_rebuild_high_water')
    OR {row}.id <= (SELECT CAST(value AS INTEGER) FROM state_meta
                    WHERE key = 'fts_rebuild_progress')"""

_FTS_ADD = """
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
        VALUES ({row}.id, {row}.content, {row}.tool_name, {row}.tool_calls);{trigram}
    INSERT INTO messages_fts_cjk(rowid, search_cjk)
        SELECT {row}.id, {row}.search_cjk WHERE {row}.search_cjk IS NOT NULL;"""
_TRIGRAM_ADD = """
    INSERT INTO messages_fts_trigram(rowid, content)
        SELECT {row}.id, {row}.content WHERE {row}.role <> 'tool';"""

_FTS_REMOVE = """
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
        VALUES ('delete', {row}.id, {row}.content, {row}.tool_name, {row}.tool_calls);{trigram}
    INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, search_cjk)
        SELECT 'delete', {row}.id, {row}.search_cjk WHERE {row}.search_cjk IS NOT NULL;"""
_TRIGRAM_REMOVE = """
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content)
        SELECT 'delete', {row}.id, {row}.content WHERE {row}.role <> 'tool';"""


# An update moves a row out of the indexes under its old id and into them under its new one,
# each where the indexes hold that id (a row another client gives a new id moves too).
_FTS_MOVE = """
    INSERT INTO messages_fts(messages_fts, rowid, content, tool_name, tool_calls)
        SELECT 'delete', old.id, old.content, old.tool_name, old.tool_calls WHERE {old};{trigram_out}
    INSERT INTO messages_fts_cjk(messages_fts_cjk, rowid, search_cjk)
        SELECT 'delete', old.id, old.search_cjk WHERE old.search_cjk IS NOT NULL AND {old};
    INSERT INTO messages_fts(rowid, content, tool_name, tool_calls)
        SELECT new.id, new.content, new.tool_name, new.tool_calls WHERE {new};{trigram_in}
    INSERT INTO messages_fts_cjk(rowid, search_cjk)
        SELECT new.id, new.search_cjk WHERE new.search_cjk IS NOT NULL AND {new};"""
_TRIGRAM_OUT = """
    INSERT INTO messages_fts_trigram(messages_fts_trigram, rowid, content)
        SELECT 'delete', old.id, old.content WHERE old.role <> 'tool' AND {old};"""
_TRIGRAM_IN = """
    INSERT INTO messages_fts_trigram(rowid, content)
        SELECT new.id, new.content WHERE new.role <> 'tool' AND {new};"""
# What the update trigger watches: a file whose trigger does not watch ``id`` has it replaced
# at open (see hermes_state_fts.replace_earlier_update_trigger).
FTS_UPDATE_OF = "AFTER UPDATE OF id, content, tool_name, tool_calls, role, search_cjk"


def _fts_triggers(*, trigram: bool) -> str:
    def add(row: str) -> str:
        return _FTS_ADD.format(row=row, trigram=_TRIGRAM_ADD.format(row=row) if trigram else "")

    def remove(row: str) -> str:
        return _FTS_REMOVE.format(
            row=row, trigram=_TRIGRAM_REMOVE.format(row=row) if trigram else "")

    gates = {"old": f"({_FTS_GATE.format(row='old')})",
             "new": f"({_FTS_GATE.format(row='new')})"}
    move = _FTS_MOVE.format(
        trigram_out=_TRIGRAM_OUT.format(**gates) if trigram else "",
        trigram_in=_TRIGRAM_IN.format(**gates) if trigram else "", **gates)
    return f"""
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages
WHEN {_FTS_GATE.format(row="new")}
BEGIN{add("new")}
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_update
{FTS_UPDATE_OF} ON messages
WHEN {gates["old"]} OR {gates["new"]}
BEGIN{move}
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages
WHEN {_FTS_GATE.format(row="old")}
BEGIN{remove("old")}
END;
"""


FTS_TRIGGERS_SQL = _fts_triggers(trigram=True)

# The same for an SQLite without the trigram tokenizer (see hermes_state_fulltext): no
# messages_fts_trigram, and triggers that feed the two other indexes only.
_TRIGRAM_TABLE_SQL = """
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts_trigram USING fts5(
    content,
    content='messages_fts_trigram_source', content_rowid='id',
    tokenize='trigram', detail='none'
);"""
FTS_SQL_WITHOUT_TRIGRAM = FTS_SQL.replace(_TRIGRAM_TABLE_SQL, "")
FTS_TRIGGERS_SQL_WITHOUT_TRIGRAM = _fts_triggers(trigram=False)

# Created on first use by the gateway's delivery ledger, not when the store is opened.
DELIVERY_OBLIGATIONS_SQL = """
CREATE TABLE IF NOT EXISTS delivery_obligations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id TEXT,
    platform TEXT NOT NULL,
    chat_id TEXT NOT NULL,
    thread_id TEXT,
    obligation_key TEXT NOT NULL UNIQUE,
    payload_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'owed',
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    settled_at REAL
);
CREATE INDEX IF NOT EXISTS idx_delivery_obligations_owed
    ON delivery_obligations(status, created_at);
"""

# The search index beside the FTS indexes, derived from `messages` like them and never copied
# (hermes_state_impact creates, fills, keeps and describes it). search_impact_state is its one
# row of state: the epoch, the reference length, the batch boundary, the fill markers, the
# damaged flag. search_impact holds the high-impact postings of each message up to the batch
# boundary (text the library computes, under the epoch it was written for); search_impact_fts
# (contentless, no positions) indexes them, each posting's term beside it, and holds the token
# _epoch_<n> of its own epoch; it keeps its %_docsize table (FTS5's default), without which a
# contentless table refuses to be scanned, so any SQLite client can list and count its rows.
# Only the library writes those, never a trigger, so a damaged index cannot fail a canonical
# write. Triggers feed two plain queues the library drains:
# search_impact_queue (messages written below the batch boundary by another client, or
# changed) and search_impact_gone (deleted messages whose postings may still be indexed).
# search_time_blocks bounds the message times of each block of 4,096 ids up to the boundary,
# for searches sorted by time. search_word_counts holds, for words common in some batch, how
# many rows of messages_fts up to id ``upto`` match the word (its idf without walking its
# whole list): true while search_row_changes's count is the state's counted_changes.
IMPACT_DEFAULT_AVGDL = 256.0
TIME_BLOCK_SHIFT = 12
SEARCH_INDEX_SQL = """
CREATE TABLE IF NOT EXISTS search_impact_state (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epoch INTEGER NOT NULL,
    avgdl REAL NOT NULL,
    indexed INTEGER NOT NULL,
    fill_high_water INTEGER,
    fill_progress INTEGER,
    damaged INTEGER NOT NULL DEFAULT 0,
    counted_changes INTEGER
);
CREATE TABLE IF NOT EXISTS search_impact (
    id INTEGER PRIMARY KEY,
    epoch INTEGER NOT NULL,
    postings TEXT NOT NULL
);
CREATE VIRTUAL TABLE IF NOT EXISTS search_impact_fts USING fts5(
    postings, content='', tokenize="unicode61 tokenchars '_'", detail='none'
);
CREATE VIRTUAL TABLE IF NOT EXISTS search_impact_vocab
    USING fts5vocab(search_impact_fts, 'instance');
CREATE TABLE IF NOT EXISTS search_impact_queue (id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS search_impact_gone (id INTEGER PRIMARY KEY);
CREATE TABLE IF NOT EXISTS search_time_blocks (
    block INTEGER PRIMARY KEY,
    first_at REAL NOT NULL,
    last_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS search_row_changes (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    changes INTEGER NOT NULL
);
INSERT OR IGNORE INTO search_row_changes (id, changes) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS search_word_counts (
    term TEXT PRIMARY KEY,
    upto INTEGER NOT NULL,
    matching INTEGER NOT NULL
) WITHOUT ROWID;
"""

SEARCH_TRIGGER_NAMES = ("search_impact_on_insert", "search_impact_on_update",
                        "search_impact_on_delete")
# Rows past the batch boundary (``indexed``) are indexed by the next batch, whoever wrote them;
# the triggers queue the rows at or below it that are inserted, changed or moved, and bound
# their times (a row whose time is not a number bounds none).
# Each such change, and every delete, counts in search_row_changes: while that count stays,
# the rows at or below the boundary are the same (what cached match counts rely on).
_BOUNDARY = "(SELECT indexed FROM search_impact_state)"
_TIME_BLOCK_UPSERT = f"""
    INSERT INTO search_time_blocks (block, first_at, last_at)
        SELECT new.id >> {TIME_BLOCK_SHIFT}, new.timestamp, new.timestamp
        WHERE typeof(new.timestamp) IN ('integer', 'real') AND new.id <= {_BOUNDARY}
    ON CONFLICT (block) DO UPDATE SET first_at = min(first_at, excluded.first_at),
                                      last_at = max(last_at, excluded.last_at);"""
_COUNT_CHANGE = "UPDATE search_row_changes SET changes = changes + 1;"
SEARCH_TRIGGERS_SQL = f"""
CREATE TRIGGER IF NOT EXISTS search_impact_on_insert AFTER INSERT ON messages
WHEN new.id <= {_BOUNDARY}
BEGIN
    INSERT OR IGNORE INTO search_impact_queue (id) VALUES (new.id);{_TIME_BLOCK_UPSERT}
    {_COUNT_CHANGE}
END;
CREATE TRIGGER IF NOT EXISTS search_impact_on_update
AFTER UPDATE OF id, content, tool_name, tool_calls, timestamp ON messages
WHEN old.id <= {_BOUNDARY} OR new.id <= {_BOUNDARY}
BEGIN
    INSERT OR IGNORE INTO search_impact_queue (id)
        SELECT value FROM (SELECT old.id AS value UNION SELECT new.id)
        WHERE value <= {_BOUNDARY};{_TIME_BLOCK_UPSERT}
    {_COUNT_CHANGE}
END;
CREATE TRIGGER IF NOT EXISTS search_impact_on_delete AFTER DELETE ON messages
BEGIN
    DELETE FROM search_impact_queue WHERE id = old.id;
    INSERT OR IGNORE INTO search_impact_gone (id) VALUES (old.id);
    {_COUNT_CHANGE}
END;
"""

# Everything but the search index, which hermes_state_impact creates on the same terms as a
# missing one (empty, its fill due).
SCHEMA_SQL = TABLES_SQL + INDEXES_SQL + FTS_SQL + FTS_TRIGGERS_SQL

# The runtime ledgers: never copied by recover (a partial ledger could replay or adopt work).
RUNTIME_LEDGER_TABLES = (
    "runtime_epoch",
    "session_admissions",
    "worker_executions",
    "worker_receipts",
)
