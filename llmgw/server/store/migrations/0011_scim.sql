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
    removed_at REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);

CREATE TABLE scim_groups (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    external_id TEXT,
    members TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL
);

-- Change capture (0005): a view of the row and three triggers, as for every table.
CREATE VIEW change_row_scim_users AS SELECT
    rowid AS rid,
    json_object('person_id', person_id) AS pk,
    json_object(
        'person_id', person_id,
        'external_id', external_id,
        'removed_at', CASE typeof(removed_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', removed_at), 'Inf', '9e999')) ELSE removed_at END,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'updated_at', CASE typeof(updated_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', updated_at), 'Inf', '9e999')) ELSE updated_at END
    ) AS row
FROM scim_users;

CREATE TRIGGER change_scim_users_insert AFTER INSERT ON scim_users BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'scim_users', 'upsert', pk, row FROM change_row_scim_users WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_scim_users_update AFTER UPDATE ON scim_users BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'scim_users', 'delete', json_object('person_id', OLD.person_id), NULL
    WHERE OLD.person_id IS NOT NEW.person_id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'scim_users', 'upsert', pk, row FROM change_row_scim_users WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_scim_users_delete AFTER DELETE ON scim_users BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('scim_users', 'delete', json_object('person_id', OLD.person_id), NULL);
END;

CREATE VIEW change_row_scim_groups AS SELECT
    rowid AS rid,
    json_object('id', id) AS pk,
    json_object(
        'id', id,
        'name', name,
        'external_id', external_id,
        'members', members,
        'created_at', CASE typeof(created_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', created_at), 'Inf', '9e999')) ELSE created_at END,
        'updated_at', CASE typeof(updated_at) WHEN 'real'
            THEN json(replace(printf('%!.17g', updated_at), 'Inf', '9e999')) ELSE updated_at END
    ) AS row
FROM scim_groups;

CREATE TRIGGER change_scim_groups_insert AFTER INSERT ON scim_groups BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'scim_groups', 'upsert', pk, row FROM change_row_scim_groups WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_scim_groups_update AFTER UPDATE ON scim_groups BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'scim_groups', 'delete', json_object('id', OLD.id), NULL
    WHERE OLD.id IS NOT NEW.id;
    INSERT INTO changes (tbl, op, pk, row)
    SELECT 'scim_groups', 'upsert', pk, row FROM change_row_scim_groups WHERE rid = NEW.rowid;
END;

CREATE TRIGGER change_scim_groups_delete AFTER DELETE ON scim_groups BEGIN
    INSERT INTO changes (tbl, op, pk, row)
    VALUES ('scim_groups', 'delete', json_object('id', OLD.id), NULL);
END;
