-- Serve jobs (issue 32): what `ctl model serve` started and how far it got. body is the
-- job as the admin API answers it (llmgw.server.catalog.jobs writes and reads it), a
-- JSON object; model and state beside it so the newest jobs of a model, and those still
-- running (a new leader carries them on), are found without reading every body. Kept
-- bounded by its writer: the newest 200, none older than 7 days.

CREATE TABLE jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    model TEXT NOT NULL,
    state TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX jobs_created ON jobs (created_at);
CREATE INDEX jobs_model ON jobs (model, created_at);
