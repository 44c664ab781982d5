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
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE orgs (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    rpm BIGINT,
    tpm BIGINT,
    budget BIGINT,
    models TEXT NOT NULL DEFAULT '[]',
    created_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE teams (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    name TEXT NOT NULL,
    rpm BIGINT,
    tpm BIGINT,
    budget BIGINT,
    models TEXT NOT NULL DEFAULT '[]',
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (org_id, name)
);

CREATE TABLE projects (
    id TEXT PRIMARY KEY,
    org_id TEXT NOT NULL,
    team_id TEXT NOT NULL,
    name TEXT NOT NULL,
    rpm BIGINT,
    tpm BIGINT,
    budget BIGINT,
    models TEXT NOT NULL DEFAULT '[]',
    created_at DOUBLE PRECISION NOT NULL,
    UNIQUE (team_id, name)
);

CREATE TABLE memberships (
    person_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    scope_id TEXT NOT NULL,
    role TEXT NOT NULL,
    by_hand INTEGER NOT NULL DEFAULT 0,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (person_id, kind, scope_id)
);

CREATE TABLE person_tokens (
    id TEXT PRIMARY KEY,
    person_id TEXT NOT NULL,
    name TEXT NOT NULL,
    token_hash TEXT NOT NULL UNIQUE,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    revoked_at DOUBLE PRECISION
);

ALTER TABLE api_keys ADD COLUMN org_id TEXT;
ALTER TABLE api_keys ADD COLUMN project_id TEXT;
ALTER TABLE api_keys ADD COLUMN person_id TEXT;

-- The organisation a change was made in, for `ctl audit --org`.
ALTER TABLE audit ADD COLUMN org_id TEXT;

INSERT INTO orgs (id, name, created_at) VALUES ('default', 'default', 0);
INSERT INTO teams (id, org_id, name, created_at) VALUES ('default', 'default', 'default', 0);
INSERT INTO projects (id, org_id, team_id, name, created_at) VALUES ('default', 'default', 'default', 'default', 0);
UPDATE api_keys SET org_id = 'default', project_id = 'default';
