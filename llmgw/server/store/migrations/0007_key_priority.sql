-- A gateway key's priority: when every replica of a model is at its slots, waiting
-- requests of higher-priority keys are served first (the gateway's queue). 0 for every
-- key made before.
ALTER TABLE api_keys ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

-- Change capture (0005) writes every column: the row's view again, with the new one.
DROP VIEW change_row_api_keys;
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
            THEN json(replace(printf('%!.17g', revoked_at), 'Inf', '9e999')) ELSE revoked_at END,
        'priority', CASE typeof(priority) WHEN 'real'
            THEN json(replace(printf('%!.17g', priority), 'Inf', '9e999')) ELSE priority END
    ) AS row
FROM api_keys;
