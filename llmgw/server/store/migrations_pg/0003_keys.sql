-- Gateway API keys: hashed, with an owner label, an allowlist and limits.
CREATE TABLE api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    key_hash TEXT NOT NULL UNIQUE,
    models TEXT NOT NULL DEFAULT '[]',
    rpm BIGINT,
    tpm BIGINT,
    budget BIGINT,
    expires_at DOUBLE PRECISION,
    created_at DOUBLE PRECISION NOT NULL,
    revoked_at DOUBLE PRECISION
);

-- Tokens and requests per day, key, model and replica, added in batches.
CREATE TABLE usage (
    day TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    replica TEXT NOT NULL,
    requests BIGINT NOT NULL DEFAULT 0,
    prompt_tokens BIGINT NOT NULL DEFAULT 0,
    completion_tokens BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (day, key_id, model, replica)
);
