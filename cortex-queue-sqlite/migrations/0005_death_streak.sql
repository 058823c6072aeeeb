-- Schema version 5: which item the last worker death was charged to.
--
-- A death while an item runs alone charges it an attempt only if the death
-- before it (of any worker) was that same item's, alone: a poison item kills
-- every worker that runs it, one after another, while kills from outside
-- land on whatever happens to run, so between two of them other items die.
-- item is NULL when the last death was a group's, an idle worker's, or
-- there was none yet.
CREATE TABLE death_streak (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    item INTEGER
);
INSERT INTO death_streak (id, item) VALUES (1, NULL);
