-- Fine-tune jobs (issue 32): each job one row, its record as JSON in `doc`
-- (server/finetune/job.py); the adapter it made in `finetune_pieces`, in order, each
-- piece base64 text (at most 1 MiB of the file), checked against the job's sha256 when
-- read back whole.
CREATE TABLE finetunes (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    model TEXT NOT NULL,
    state TEXT NOT NULL,
    doc TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX finetunes_name ON finetunes (name);

CREATE TABLE finetune_pieces (
    id TEXT NOT NULL,
    piece INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (id, piece)
);
