-- The foundation: nodes, join tokens, admin tokens, settings and the audit trail.
CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE admin_tokens (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL
);

CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    secret_sealed TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    created_by TEXT NOT NULL,
    used_at REAL,
    used_by TEXT
);

CREATE TABLE nodes (
    id TEXT PRIMARY KEY,
    address TEXT,
    state TEXT NOT NULL,
    state_reason TEXT NOT NULL DEFAULT '',
    cert_serial TEXT NOT NULL,
    version TEXT NOT NULL DEFAULT '',
    facts TEXT NOT NULL DEFAULT '{}',
    enrolled_at REAL NOT NULL,
    registered_at REAL,
    last_seen REAL
);

CREATE TABLE audit (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
