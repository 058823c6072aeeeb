-- Schema version 4: results are stored as typed responses (JSON of the
-- response, without token ids) and rendered in the caller's format at export.
-- Rows written before keep their rendered body and an empty response.
ALTER TABLE results ADD COLUMN response TEXT;
