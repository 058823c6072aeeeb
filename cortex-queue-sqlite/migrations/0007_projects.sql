-- Schema version 7: projects.
--
-- Every job belongs to a project: a server maps each API key to one, and a
-- key sees only its own project's jobs. Jobs from before belong to the
-- `default` project, as CLI jobs do.
ALTER TABLE jobs ADD COLUMN project TEXT NOT NULL DEFAULT 'default';
CREATE INDEX jobs_project ON jobs (project, id);
