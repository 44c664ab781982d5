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
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);
CREATE INDEX finetunes_name ON finetunes (name);

CREATE TABLE finetune_pieces (
    id TEXT NOT NULL,
    piece INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (id, piece)
);

-- Change capture (0005): both tables ship to standbys.
CREATE VIEW change_row_finetunes AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'name', name,
        'model', model,
        'state', state,
        'doc', doc,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'updated_at', CASE typeof(updated_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', updated_at), 'Inf', '9e999')) ELSE updated_at END
    ) AS row
FROM finetunes;

CREATE TRIGGER change_finetunes_insert AFTER INSERT ON finetunes BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'finetunes', 'upsert', pk, row FROM change_row_finetunes WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_finetunes_update AFTER UPDATE ON finetunes BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'finetunes', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'finetunes', 'upsert', pk, row FROM change_row_finetunes WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_finetunes_delete AFTER DELETE ON finetunes BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('finetunes', 'delete', json_object('id', OLD.id), NULL);
END;

CREATE VIEW change_row_finetune_pieces AS SELECT
    rowid AS rid,
    json_object('id', id, 'piece', piece) AS pk,
    json_object('id', id, 'piece', piece, 'data', data) AS row
FROM finetune_pieces;

CREATE TRIGGER change_finetune_pieces_insert AFTER INSERT ON finetune_pieces BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'finetune_pieces', 'upsert', pk, row FROM change_row_finetune_pieces
    WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_finetune_pieces_update AFTER UPDATE ON finetune_pieces BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'finetune_pieces', 'delete', json_object('id', OLD.id, 'piece', OLD.piece), NULL
    WHERE OLD.id IS NOT NEW.id OR OLD.piece IS NOT NEW.piece;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'finetune_pieces', 'upsert', pk, row FROM change_row_finetune_pieces
    WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_finetune_pieces_delete AFTER DELETE ON finetune_pieces BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('finetune_pieces', 'delete', json_object('id', OLD.id, 'piece', OLD.piece), NULL);
END;
