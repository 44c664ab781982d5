-- Admin page sessions signed out before they would have ended (server/sessions.py, Revocations).
-- A session is a signed cookie every control plane honours; its id here makes every
-- control plane refuse it, a standby too (captured below, so it is shipped). A row is
-- of no use once its session would have ended (`expires_at`): signing out removes
-- those, so the list holds at most the sessions signed out in the last 12 hours.
CREATE TABLE session_revocations (
    sid TEXT PRIMARY KEY,
    expires_at REAL NOT NULL,
    revoked_at REAL NOT NULL
);

-- Change capture (0005): a view of the row and three triggers, as for every table.
CREATE VIEW change_row_session_revocations AS SELECT
    rowid AS rid,
    json_object('sid', sid) AS pk,
    json_object(
        'sid', sid,
        'expires_at', CASE typeof(expires_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', expires_at), 'Inf', '9e999')) ELSE expires_at END,
        'revoked_at', CASE typeof(revoked_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', revoked_at), 'Inf', '9e999')) ELSE revoked_at END
    ) AS row
FROM session_revocations;

CREATE TRIGGER change_session_revocations_insert AFTER INSERT ON session_revocations BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'session_revocations', 'upsert', pk, row
    FROM change_row_session_revocations WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_session_revocations_update AFTER UPDATE ON session_revocations BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'session_revocations', 'delete', json_object('sid', OLD.sid), NULL
    WHERE OLD.sid IS NOT NEW.sid;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'session_revocations', 'upsert', pk, row
    FROM change_row_session_revocations WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_session_revocations_delete AFTER DELETE ON session_revocations BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('session_revocations', 'delete', json_object('sid', OLD.sid), NULL);
END;
