-- Control planes: the first is written at `server init`, each standby at `server join`.
-- A removed one keeps its row (removed_at) so its certificate stays refused.
CREATE TABLE servers (
    name TEXT PRIMARY KEY,
    cert_serial TEXT NOT NULL,
    api_address TEXT NOT NULL,
    agent_address TEXT NOT NULL,
    peer_address TEXT NOT NULL,
    joined_at DOUBLE PRECISION NOT NULL,
    removed_at DOUBLE PRECISION
);
