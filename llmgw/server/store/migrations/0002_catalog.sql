-- The catalog: models (their profiles inside the spec, as JSON), and how nodes are
-- scheduled (cordoned, draining, labels).
CREATE TABLE models (
    name TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);

ALTER TABLE nodes ADD COLUMN cordoned INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN draining INTEGER NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN labels TEXT NOT NULL DEFAULT '{}';
