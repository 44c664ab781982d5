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
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX jobs_created ON jobs (created_at);
CREATE INDEX jobs_model ON jobs (model, created_at);

-- Change capture (0005): a view of the row and three triggers, as for every table.
CREATE VIEW change_row_jobs AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'kind', kind,
        'model', model,
        'state', state,
        'body', body,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'updated_at', CASE typeof(updated_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', updated_at), 'Inf', '9e999')) ELSE updated_at END
    ) AS row
FROM jobs;

CREATE TRIGGER change_jobs_insert AFTER INSERT ON jobs BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'jobs', 'upsert', pk, row FROM change_row_jobs WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_jobs_update AFTER UPDATE ON jobs BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'jobs', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'jobs', 'upsert', pk, row FROM change_row_jobs WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_jobs_delete AFTER DELETE ON jobs BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('jobs', 'delete', json_object('id', OLD.id), NULL);
END;
