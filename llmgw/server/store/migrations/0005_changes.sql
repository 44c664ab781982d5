-- Change capture, for standby control planes that follow the leader's store
-- (server/ha/sqlitesync.py ships and applies these rows).
--
-- Every write to a replicated table appends one row to `changes` in the same
-- transaction: 'upsert' with the whole row after it (every column, as a JSON object) or
-- 'delete' with the primary key before it. An UPDATE that moves a primary key is a
-- 'delete' of the old key and an 'upsert' of the new. `seq` only grows (AUTOINCREMENT:
-- never reused, even once pruned), so a follower asks for what follows the last it has.
--
-- Not captured: the settings 'store.checked_at' (rewritten every few seconds to learn
-- whether the store takes writes) and 'local.*' (each control plane's own), and
-- `replica_state`, a standby's own bookkeeping.
--
-- Each table's row is built once, in a view the triggers read by rowid. json_object
-- writes a REAL with 15 digits, which loses a timestamp's last ones; a REAL is written
-- here with 17 (printf '%!.17g', read back as JSON by json()), which gives back the same
-- double, and an infinity as 9e999, which reads back as one. (SQLite 3.40's printf can
-- miss the 17th digit of a double past about 1e100; no column here holds one.) Columns
-- holding JSON text (facts, labels, spec, models) are kept as strings, as written.
--
-- A later migration that adds a column to a replicated table must drop and create its
-- view again with the column; a new table needs a view, three triggers and its name
-- in sqlitesync.REPLICATED (tests/server/ha checks both). Writers must not use
-- INSERT OR REPLACE to remove a row by a UNIQUE column other than the key: that delete
-- fires no trigger (recursive_triggers is off).

CREATE TABLE changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tbl TEXT NOT NULL,
    op TEXT NOT NULL,
    pk TEXT NOT NULL,
    row TEXT,
    at REAL NOT NULL DEFAULT ((julianday('now') - 2440587.5) * 86400.0)
);

CREATE TABLE replica_state (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE VIEW change_row_settings AS SELECT
    rowid AS rid,
    json_object('key', key) AS pk,
    json_object(
        'key', key,
        'value', value
    ) AS row
FROM settings;

CREATE TRIGGER change_settings_insert AFTER INSERT ON settings
WHEN NEW.key <> 'store.checked_at' AND substr(NEW.key, 1, 6) <> 'local.' BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'settings', 'upsert', pk, row FROM change_row_settings WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_settings_update AFTER UPDATE ON settings BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'settings', 'delete', json_object('key', OLD.key), NULL
    WHERE OLD.key IS NOT NEW.key
        AND OLD.key <> 'store.checked_at' AND substr(OLD.key, 1, 6) <> 'local.';
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'settings', 'upsert', pk, row FROM change_row_settings WHERE rid = NEW.rowid
        AND NEW.key <> 'store.checked_at' AND substr(NEW.key, 1, 6) <> 'local.';
END;

CREATE TRIGGER change_settings_delete AFTER DELETE ON settings
WHEN OLD.key <> 'store.checked_at' AND substr(OLD.key, 1, 6) <> 'local.' BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('settings', 'delete', json_object('key', OLD.key), NULL);
END;

CREATE VIEW change_row_admin_tokens AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'token_hash', token_hash,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END
    ) AS row
FROM admin_tokens;

CREATE TRIGGER change_admin_tokens_insert AFTER INSERT ON admin_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'admin_tokens', 'upsert', pk, row FROM change_row_admin_tokens WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_admin_tokens_update AFTER UPDATE ON admin_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'admin_tokens', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'admin_tokens', 'upsert', pk, row FROM change_row_admin_tokens WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_admin_tokens_delete AFTER DELETE ON admin_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('admin_tokens', 'delete', json_object('id', OLD.id), NULL);
END;

CREATE VIEW change_row_join_tokens AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'secret_sealed', secret_sealed,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'expires_at', CASE typeof(expires_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', expires_at), 'Inf', '9e999')) ELSE expires_at END,
        'created_by', created_by,
        'used_at', CASE typeof(used_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', used_at), 'Inf', '9e999')) ELSE used_at END,
        'used_by', used_by
    ) AS row
FROM join_tokens;

CREATE TRIGGER change_join_tokens_insert AFTER INSERT ON join_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'join_tokens', 'upsert', pk, row FROM change_row_join_tokens WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_join_tokens_update AFTER UPDATE ON join_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'join_tokens', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'join_tokens', 'upsert', pk, row FROM change_row_join_tokens WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_join_tokens_delete AFTER DELETE ON join_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('join_tokens', 'delete', json_object('id', OLD.id), NULL);
END;

CREATE VIEW change_row_nodes AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'address', address,
        'state', state,
        'state_reason', state_reason,
        'cert_serial', cert_serial,
        'version', version,
        'facts', facts,
        'enrolled_at', CASE typeof(enrolled_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', enrolled_at), 'Inf', '9e999')) ELSE enrolled_at END,
        'registered_at', CASE typeof(registered_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', registered_at), 'Inf', '9e999')) ELSE registered_at END,
        'last_seen', CASE typeof(last_seen) WHEN 'real'
            THEN json(replace(printf('%!.17g', last_seen), 'Inf', '9e999')) ELSE last_seen END,
        'cordoned', CASE typeof(cordoned) WHEN 'real'
            THEN json(replace(printf('%!.17g', cordoned), 'Inf', '9e999')) ELSE cordoned END,
        'draining', CASE typeof(draining) WHEN 'real'
            THEN json(replace(printf('%!.17g', draining), 'Inf', '9e999')) ELSE draining END,
        'labels', labels
    ) AS row
FROM nodes;

CREATE TRIGGER change_nodes_insert AFTER INSERT ON nodes BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'nodes', 'upsert', pk, row FROM change_row_nodes WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_nodes_update AFTER UPDATE ON nodes BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'nodes', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'nodes', 'upsert', pk, row FROM change_row_nodes WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_nodes_delete AFTER DELETE ON nodes BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('nodes', 'delete', json_object('id', OLD.id), NULL);
END;

CREATE VIEW change_row_audit AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'at', CASE typeof(at) WHEN 'real'
            THEN json(replace(printf('%!.17g', at), 'Inf', '9e999')) ELSE at END,
        'actor', actor,
        'action', action,
        'target', target,
        'detail', detail
    ) AS row
FROM audit;

CREATE TRIGGER change_audit_insert AFTER INSERT ON audit BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'audit', 'upsert', pk, row FROM change_row_audit WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_audit_update AFTER UPDATE ON audit BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'audit', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'audit', 'upsert', pk, row FROM change_row_audit WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_audit_delete AFTER DELETE ON audit BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('audit', 'delete', json_object('id', OLD.id), NULL);
END;

CREATE VIEW change_row_models AS SELECT
    rowid AS rid,
    json_object('name', name) AS pk,
    json_object(
        'name', name,
        'spec', spec,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'updated_at', CASE typeof(updated_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', updated_at), 'Inf', '9e999')) ELSE updated_at END
    ) AS row
FROM models;

CREATE TRIGGER change_models_insert AFTER INSERT ON models BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'models', 'upsert', pk, row FROM change_row_models WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_models_update AFTER UPDATE ON models BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'models', 'delete', json_object('name', OLD.name), NULL
    WHERE OLD.name IS NOT NEW.name;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'models', 'upsert', pk, row FROM change_row_models WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_models_delete AFTER DELETE ON models BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('models', 'delete', json_object('name', OLD.name), NULL);
END;

CREATE VIEW change_row_api_keys AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'name', name,
        'key_hash', key_hash,
        'models', models,
        'rpm', CASE typeof(rpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', rpm), 'Inf', '9e999')) ELSE rpm END,
        'tpm', CASE typeof(tpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', tpm), 'Inf', '9e999')) ELSE tpm END,
        'budget', CASE typeof(budget) WHEN 'real'
            THEN json(replace(printf('%!.17g', budget), 'Inf', '9e999')) ELSE budget END,
        'expires_at', CASE typeof(expires_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', expires_at), 'Inf', '9e999')) ELSE expires_at END,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'revoked_at', CASE typeof(revoked_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', revoked_at), 'Inf', '9e999')) ELSE revoked_at END
    ) AS row
FROM api_keys;

CREATE TRIGGER change_api_keys_insert AFTER INSERT ON api_keys BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'api_keys', 'upsert', pk, row FROM change_row_api_keys WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_api_keys_update AFTER UPDATE ON api_keys BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'api_keys', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'api_keys', 'upsert', pk, row FROM change_row_api_keys WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_api_keys_delete AFTER DELETE ON api_keys BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('api_keys', 'delete', json_object('id', OLD.id), NULL);
END;

CREATE VIEW change_row_usage AS SELECT
    rowid AS rid,
    json_object('day', day, 'key_id', key_id, 'model', model, 'replica', replica) AS pk,
    json_object(
        'day', day,
        'key_id', key_id,
        'model', model,
        'replica', replica,
        'requests', CASE typeof(requests) WHEN 'real'
            THEN json(replace(printf('%!.17g', requests), 'Inf', '9e999')) ELSE requests END,
        'prompt_tokens', CASE typeof(prompt_tokens) WHEN 'real'
            THEN json(replace(printf('%!.17g', prompt_tokens), 'Inf', '9e999')) ELSE prompt_tokens END,
        'completion_tokens', CASE typeof(completion_tokens) WHEN 'real'
            THEN json(replace(printf('%!.17g', completion_tokens), 'Inf', '9e999')) ELSE completion_tokens END
    ) AS row
FROM usage;

CREATE TRIGGER change_usage_insert AFTER INSERT ON usage BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'usage', 'upsert', pk, row FROM change_row_usage WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_usage_update AFTER UPDATE ON usage BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'usage', 'delete', json_object(
        'day', OLD.day, 'key_id', OLD.key_id, 'model', OLD.model, 'replica', OLD.replica
    ), NULL
    WHERE (OLD.day, OLD.key_id, OLD.model, OLD.replica)
        IS NOT (NEW.day, NEW.key_id, NEW.model, NEW.replica);
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'usage', 'upsert', pk, row FROM change_row_usage WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_usage_delete AFTER DELETE ON usage BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('usage', 'delete', json_object(
        'day', OLD.day, 'key_id', OLD.key_id, 'model', OLD.model, 'replica', OLD.replica
    ), NULL);
END;

CREATE VIEW change_row_servers AS SELECT
    rowid AS rid,
    json_object('name', name) AS pk,
    json_object(
        'name', name,
        'cert_serial', cert_serial,
        'api_address', api_address,
        'agent_address', agent_address,
        'peer_address', peer_address,
        'joined_at', CASE typeof(joined_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', joined_at), 'Inf', '9e999')) ELSE joined_at END,
        'removed_at', CASE typeof(removed_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', removed_at), 'Inf', '9e999')) ELSE removed_at END
    ) AS row
FROM servers;

CREATE TRIGGER change_servers_insert AFTER INSERT ON servers BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'servers', 'upsert', pk, row FROM change_row_servers WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_servers_update AFTER UPDATE ON servers BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'servers', 'delete', json_object('name', OLD.name), NULL
    WHERE OLD.name IS NOT NEW.name;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'servers', 'upsert', pk, row FROM change_row_servers WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_servers_delete AFTER DELETE ON servers BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('servers', 'delete', json_object('name', OLD.name), NULL);
END;
