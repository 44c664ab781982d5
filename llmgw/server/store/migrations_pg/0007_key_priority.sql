-- A gateway key's priority: when every replica of a model is at its slots, waiting
-- requests of higher-priority keys are served first (the gateway's queue). 0 for every
-- key made before.
ALTER TABLE api_keys ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
