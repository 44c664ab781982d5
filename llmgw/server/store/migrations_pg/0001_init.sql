-- The foundation: nodes, join tokens, admin tokens, settings and the audit trail.
-- PostgreSQL's dialect of migrations/0001_init.sql: the same tables, columns and
-- constraints, so records read back as they do from SQLite.
CREATE TABLE settings (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE admin_tokens (
    id TEXT PRIMARY KEY,
    token_hash TEXT NOT NULL UNIQUE,
    created_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE join_tokens (
    id TEXT PRIMARY KEY,
    secret_sealed TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    created_by TEXT NOT NULL,
    used_at DOUBLE PRECISION,
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
    enrolled_at DOUBLE PRECISION NOT NULL,
    registered_at DOUBLE PRECISION,
    last_seen DOUBLE PRECISION
);

CREATE TABLE audit (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT ''
);
