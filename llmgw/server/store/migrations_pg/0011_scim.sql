-- SCIM 2.0 provisioning (server/scim/): what the identity provider said of people and
-- groups beyond the people table.
--
-- scim_users: a person the provider manages, by our id (SCIM's id is the person's id):
-- the provider's externalId for them, and removed_at once the provider DELETEd them (the
-- person stays, deactivated: SCIM never erases anyone; a removed user answers 404).
-- scim_groups: a group of the provider, its displayName (what `ctl auth scim map` maps
-- to memberships), externalId and members (person ids, a JSON list).

CREATE TABLE scim_users (
    person_id TEXT PRIMARY KEY,
    external_id TEXT,
    removed_at DOUBLE PRECISION,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);

CREATE TABLE scim_groups (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    external_id TEXT,
    members TEXT NOT NULL DEFAULT '[]',
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL
);
