-- MCP tool grants and guard policies (issue 31) on organisations, teams, projects and
-- gateway keys. tools: NULL says nothing of tools at this level; otherwise a JSON list
-- of SERVER.TOOL patterns, where '[]' closes the level (and everything beneath it) to
-- every tool. guard: the names of the guard policies read at this level, a JSON list.

ALTER TABLE orgs ADD COLUMN tools TEXT;
ALTER TABLE orgs ADD COLUMN guard TEXT NOT NULL DEFAULT '[]';
ALTER TABLE teams ADD COLUMN tools TEXT;
ALTER TABLE teams ADD COLUMN guard TEXT NOT NULL DEFAULT '[]';
ALTER TABLE projects ADD COLUMN tools TEXT;
ALTER TABLE projects ADD COLUMN guard TEXT NOT NULL DEFAULT '[]';
ALTER TABLE api_keys ADD COLUMN tools TEXT;
ALTER TABLE api_keys ADD COLUMN guard TEXT NOT NULL DEFAULT '[]';

-- Change capture (0005) writes every column: each view again, with the new ones.
DROP VIEW change_row_orgs;
CREATE VIEW change_row_orgs AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'name', name,
        'rpm', CASE typeof(rpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', rpm), 'Inf', '9e999')) ELSE rpm END,
        'tpm', CASE typeof(tpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', tpm), 'Inf', '9e999')) ELSE tpm END,
        'budget', CASE typeof(budget) WHEN 'real'
            THEN json(replace(printf('%!.17g', budget), 'Inf', '9e999')) ELSE budget END,
        'models', models,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'tools', tools,
        'guard', guard
    ) AS row
FROM orgs;

DROP VIEW change_row_teams;
CREATE VIEW change_row_teams AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'org_id', org_id,
        'name', name,
        'rpm', CASE typeof(rpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', rpm), 'Inf', '9e999')) ELSE rpm END,
        'tpm', CASE typeof(tpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', tpm), 'Inf', '9e999')) ELSE tpm END,
        'budget', CASE typeof(budget) WHEN 'real'
            THEN json(replace(printf('%!.17g', budget), 'Inf', '9e999')) ELSE budget END,
        'models', models,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'tools', tools,
        'guard', guard
    ) AS row
FROM teams;

DROP VIEW change_row_projects;
CREATE VIEW change_row_projects AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'org_id', org_id,
        'team_id', team_id,
        'name', name,
        'rpm', CASE typeof(rpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', rpm), 'Inf', '9e999')) ELSE rpm END,
        'tpm', CASE typeof(tpm) WHEN 'real'
            THEN json(replace(printf('%!.17g', tpm), 'Inf', '9e999')) ELSE tpm END,
        'budget', CASE typeof(budget) WHEN 'real'
            THEN json(replace(printf('%!.17g', budget), 'Inf', '9e999')) ELSE budget END,
        'models', models,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'tools', tools,
        'guard', guard
    ) AS row
FROM projects;

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
            THEN json(replace(printf('%!.17g', priority), 'Inf', '9e999')) ELSE priority END,
        'org_id', org_id,
        'project_id', project_id,
        'person_id', person_id,
        'tools', tools,
        'guard', guard
    ) AS row
FROM api_keys;
