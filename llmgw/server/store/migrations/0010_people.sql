-- People, organisations, teams and projects (server/people/), and keys that belong to
-- a project or a person.
--
-- A person signs in as their login; their cluster role (viewer, operator, admin) may be
-- NULL: only their memberships give them anything. A membership makes a person a member,
-- manager or admin of an organisation or a team ('org' or 'team' and its id). A role or
-- membership set by an admin by hand (role_by_hand, by_hand) is never lowered by an
-- identity provider's groups. Organisations, teams and projects each carry the same
-- limits as a key (rpm, tpm, budget, models as a JSON list); the tightest wins.
-- Personal tokens (for ctl and the API) are kept as SHA-256 hashes only.
--
-- Every key made before goes under the default organisation, team and project, so it
-- keeps working and its usage has an owner.
CREATE TABLE people (
    id TEXT PRIMARY KEY,
    login TEXT NOT NULL UNIQUE,
    name TEXT NOT NULL DEFAULT '',
    email TEXT NOT NULL DEFAULT '',
    role TEXT,
    role_by_hand INTEGER NOT NULL DEFAULT 0,
    source TEXT NOT NULL DEFAULT 'local',
    subject TEXT UNIQUE,
    active INTEGER NOT NULL DEFAULT 1,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);

CREATE TABLE orgs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    rpm INTEGER,
    tpm INTEGER,
    budget INTEGER,
    models TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL
);

CREATE TABLE teams (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    name TEXT NOT NULL,
    rpm INTEGER,
    tpm INTEGER,
    budget INTEGER,
    models TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    UNIQUE (org_id, name)
);

CREATE TABLE projects (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    team_id TEXT NOT NULL,
    name TEXT NOT NULL,
    rpm INTEGER,
    tpm INTEGER,
    budget INTEGER,
    models TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    UNIQUE (team_id, name)
);

CREATE TABLE memberships (
    person_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    scope_id TEXT NOT NULL,
    role TEXT NOT NULL,
    by_hand INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    PRIMARY KEY (person_id, kind, scope_id)
);

CREATE TABLE person_tokens (
    id TEXT PRIMARY KEY,
    person_id TEXT NOT NULL,
    name TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    expires_at REAL,
    revoked_at REAL
);

ALTER TABLE api_keys ADD COLUMN org_id TEXT;
ALTER TABLE api_keys ADD COLUMN project_id TEXT;
ALTER TABLE api_keys ADD COLUMN person_id TEXT;

-- The organisation a change was made in, for `ctl audit --org`.
ALTER TABLE audit ADD COLUMN org_id TEXT;

-- Written before the capture below: every control plane's migration writes them alike
-- (created at 0: when is not known).
INSERT INTO orgs (id, name, created_at) VALUES ('default', 'default', 0);
INSERT INTO teams (id, org_id, name, created_at) VALUES ('default', 'default', 'default', 0);
INSERT INTO projects (id, org_id, team_id, name, created_at) VALUES ('default', 'default', 'default', 'default', 0);
UPDATE api_keys SET org_id = 'default', project_id = 'default';

-- Change capture (0005): a view of the row and three triggers, as for every table.
CREATE VIEW change_row_people AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'login', login,
        'name', name,
        'email', email,
        'role', role,
        'role_by_hand', CASE typeof(role_by_hand) WHEN 'real'
            THEN json(replace(printf('%!.17g', role_by_hand), 'Inf', '9e999')) ELSE role_by_hand END,
        'source', source,
        'subject', subject,
        'active', CASE typeof(active) WHEN 'real'
            THEN json(replace(printf('%!.17g', active), 'Inf', '9e999')) ELSE active END,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'updated_at', CASE typeof(updated_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', updated_at), 'Inf', '9e999')) ELSE updated_at END
    ) AS row
FROM people;

CREATE TRIGGER change_people_insert AFTER INSERT ON people BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'people', 'upsert', pk, row FROM change_row_people WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_people_update AFTER UPDATE ON people BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'people', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'people', 'upsert', pk, row FROM change_row_people WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_people_delete AFTER DELETE ON people BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('people', 'delete', json_object('id', OLD.id), NULL);
END;

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
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END
    ) AS row
FROM orgs;

CREATE TRIGGER change_orgs_insert AFTER INSERT ON orgs BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'orgs', 'upsert', pk, row FROM change_row_orgs WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_orgs_update AFTER UPDATE ON orgs BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'orgs', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'orgs', 'upsert', pk, row FROM change_row_orgs WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_orgs_delete AFTER DELETE ON orgs BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('orgs', 'delete', json_object('id', OLD.id), NULL);
END;

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
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END
    ) AS row
FROM teams;

CREATE TRIGGER change_teams_insert AFTER INSERT ON teams BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'teams', 'upsert', pk, row FROM change_row_teams WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_teams_update AFTER UPDATE ON teams BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'teams', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'teams', 'upsert', pk, row FROM change_row_teams WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_teams_delete AFTER DELETE ON teams BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('teams', 'delete', json_object('id', OLD.id), NULL);
END;

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
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END
    ) AS row
FROM projects;

CREATE TRIGGER change_projects_insert AFTER INSERT ON projects BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'projects', 'upsert', pk, row FROM change_row_projects WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_projects_update AFTER UPDATE ON projects BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'projects', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'projects', 'upsert', pk, row FROM change_row_projects WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_projects_delete AFTER DELETE ON projects BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('projects', 'delete', json_object('id', OLD.id), NULL);
END;

CREATE VIEW change_row_memberships AS SELECT
    rowid AS rid,
    json_object('person_id', person_id, 'kind', kind, 'scope_id', scope_id) AS pk,
    json_object(
        'person_id', person_id,
        'kind', kind,
        'scope_id', scope_id,
        'role', role,
        'by_hand', CASE typeof(by_hand) WHEN 'real'
            THEN json(replace(printf('%!.17g', by_hand), 'Inf', '9e999')) ELSE by_hand END,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END
    ) AS row
FROM memberships;

CREATE TRIGGER change_memberships_insert AFTER INSERT ON memberships BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'memberships', 'upsert', pk, row FROM change_row_memberships WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_memberships_update AFTER UPDATE ON memberships BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'memberships', 'delete', json_object('person_id', OLD.person_id, 'kind', OLD.kind, 'scope_id', OLD.scope_id), NULL
    WHERE OLD.person_id IS NOT NEW.person_id OR OLD.kind IS NOT NEW.kind OR OLD.scope_id IS NOT NEW.scope_id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'memberships', 'upsert', pk, row FROM change_row_memberships WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_memberships_delete AFTER DELETE ON memberships BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('memberships', 'delete', json_object('person_id', OLD.person_id, 'kind', OLD.kind, 'scope_id', OLD.scope_id), NULL);
END;

CREATE VIEW change_row_person_tokens AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'person_id', person_id,
        'name', name,
        'token_hash', token_hash,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'expires_at', CASE typeof(expires_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', expires_at), 'Inf', '9e999')) ELSE expires_at END,
        'revoked_at', CASE typeof(revoked_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', revoked_at), 'Inf', '9e999')) ELSE revoked_at END
    ) AS row
FROM person_tokens;

CREATE TRIGGER change_person_tokens_insert AFTER INSERT ON person_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'person_tokens', 'upsert', pk, row FROM change_row_person_tokens WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_person_tokens_update AFTER UPDATE ON person_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'person_tokens', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'person_tokens', 'upsert', pk, row FROM change_row_person_tokens WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_person_tokens_delete AFTER DELETE ON person_tokens BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('person_tokens', 'delete', json_object('id', OLD.id), NULL);
END;

-- The audit's view again, with its new column.
DROP VIEW change_row_audit;
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
        'detail', detail,
        'org_id', org_id
    ) AS row
FROM audit;

-- The keys' view again, with the new columns.
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
        'person_id', person_id
    ) AS row
FROM api_keys;
