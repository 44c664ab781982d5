-- The catalog: models (their profiles inside the spec, as JSON text, as in SQLite), and
-- how nodes are scheduled (cordoned, draining, labels).
CREATE TABLE models (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

-- 0 or 1, as in SQLite: the store reads them as booleans.
ALTER TABLE nodes ADD COLUMN cordoned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
