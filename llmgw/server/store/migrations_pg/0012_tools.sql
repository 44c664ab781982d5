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
