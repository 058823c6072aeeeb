-- Schema version 6: output grammars stored once.
--
-- A structured-output job carries the same compiled grammar (often a few KB)
-- on every item; items now store its SHA-256 (`grammar_sha256` in the stored
-- request) and the text lives here once.
CREATE TABLE grammars (
    sha256 TEXT PRIMARY KEY,
    text TEXT NOT NULL
) WITHOUT ROWID;
