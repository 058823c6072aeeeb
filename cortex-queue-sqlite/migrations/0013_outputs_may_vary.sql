-- Schema version 13: whether a worker where a line's output can change with
-- what runs beside it (a GPU, llama.cpp's kernels, weights cortex's kernels
-- do not take) has claimed any of a job's lines. Set once, at such a claim;
-- jobs from before this version read as never so claimed.
ALTER TABLE jobs ADD COLUMN outputs_may_vary INTEGER NOT NULL DEFAULT 0;
