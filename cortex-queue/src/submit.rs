//! Submitting a JSONL file as one job, in one transaction.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use cortex_request::{SamplingParams, StopConditions, Work};
use rusqlite::{ErrorCode, OptionalExtension, params};
use sha2::{Digest, Sha256};

use crate::store::{Store, now_ms};
use crate::{DEFAULT_PROJECT, InputReport, JobId, JobState, QueueError, Result};

/// One valid input line, parsed: what the queue stores for it.
#[derive(Debug, Clone, PartialEq)]
pub struct NewItem {
    /// 1-based line number in the file.
    pub line: u64,
    /// The caller's id, unique in the job.
    pub custom_id: String,
    /// The format its output is rendered in (an endpoint path such as
    /// `/v1/chat/completions`; the queue stores it and hands it back).
    pub endpoint: String,
    /// The `model` the line named, if any (recorded, not used to pick a model).
    pub model: Option<String>,
    /// What it asks for (its `id` is assigned when stored).
    pub request: Work,
}

/// One bad input line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    /// 1-based line number.
    pub line: u64,
    /// The line's `custom_id`, when it could be read.
    pub custom_id: Option<String>,
    /// What is wrong, naming the field.
    pub message: String,
}

impl std::fmt::Display for LineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.custom_id {
            Some(id) => write!(f, "line {} (custom_id {id:?}): {}", self.line, self.message),
            None => write!(f, "line {}: {}", self.line, self.message),
        }
    }
}

impl LineError {
    /// A line whose `custom_id` an earlier line (`first_line`, when known) already used.
    pub fn duplicate_custom_id(line: u64, custom_id: &str, first_line: Option<u64>) -> Self {
        let first = first_line.map_or_else(String::new, |l| format!(" (first used on line {l})"));
        Self {
            line,
            custom_id: Some(custom_id.to_owned()),
            message: format!("duplicate custom_id {custom_id:?}{first}"),
        }
    }
}

/// What a reader yields per non-blank line.
pub type LineResult = std::result::Result<NewItem, LineError>;

/// A job's default sampling and stop settings; each line's own fields override them.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct JobDefaults {
    /// Sampling defaults.
    pub sampling: SamplingParams,
    /// Stop defaults (`max_tokens`, stop strings, ...).
    pub stop: StopConditions,
}

/// A job's input, parsed line by line by the caller (the wire-format crate
/// knows the line formats; the queue stores what they mean).
pub trait ItemSource: Iterator<Item = std::io::Result<LineResult>> {
    /// SHA-256 (hex) of the whole input, once every line was read: with the
    /// submit parameters it identifies a resubmission of the same file.
    fn source_sha256(&mut self) -> String;
}

/// How a job is submitted.
#[derive(Debug, Clone, PartialEq)]
pub struct SubmitOptions {
    /// The model the job is meant for (its name; recorded and shown).
    pub model: String,
    /// The identity of that model (the GGUF's SHA-256, hex): only workers
    /// running this model claim the job. `None` lets any worker run it.
    pub model_sha256: Option<String>,
    /// Defaults for fields a line does not set.
    pub defaults: JobDefaults,
    /// Free-form labels.
    pub metadata: BTreeMap<String, String>,
    /// The project the job belongs to (default [`crate::DEFAULT_PROJECT`]).
    pub project: String,
    /// Jobs with a higher priority are claimed first.
    pub priority: i32,
    /// Most attempts per item before a retryable failure becomes final.
    pub max_attempts: u32,
    /// Accept the valid lines and record the bad ones as failed, instead of
    /// rejecting the whole file.
    pub skip_invalid: bool,
    /// Submit even if the same file with the same parameters was submitted before.
    pub force: bool,
}

impl SubmitOptions {
    /// Defaults for `model`: all-or-nothing, 3 attempts, priority 0.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            model_sha256: None,
            defaults: JobDefaults::default(),
            metadata: BTreeMap::new(),
            project: DEFAULT_PROJECT.to_owned(),
            priority: 0,
            max_attempts: 3,
            skip_invalid: false,
            force: false,
        }
    }
}

/// What a successful submit stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The new job.
    pub job: JobId,
    /// Items stored.
    pub items: u64,
    /// Bad lines recorded as failed (only with `skip_invalid`).
    pub invalid: u64,
    /// The first bad lines (at most 100), for a message.
    pub first_errors: Vec<LineError>,
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// Identifies "the same parameters" for duplicate detection.
pub fn params_hash(options: &SubmitOptions) -> String {
    let mut canonical = serde_json::json!({
        "model": options.model,
        "model_sha256": options.model_sha256,
        "defaults": options.defaults,
    });
    // Only another project's: the hashes of jobs from before projects stay as they were.
    if options.project != DEFAULT_PROJECT {
        canonical["project"] = options.project.clone().into();
    }
    hex(&Sha256::digest(canonical.to_string()))
}

/// How many bad lines a submit keeps for its message.
pub const KEEP_ERRORS: usize = 100;

impl Store {
    /// Stores a job and all its items in one transaction, so no partial job
    /// is ever visible. Every line is checked; with bad lines the job is
    /// rejected with a report of all of them unless `options.skip_invalid`.
    /// `source_name` names the input in messages and listings.
    pub(crate) fn submit_in_one_transaction(
        &mut self,
        input: &mut dyn ItemSource,
        source_name: &str,
        options: &SubmitOptions,
    ) -> Result<Submitted> {
        let db_path = self.path.clone();
        let to_error = |e: &rusqlite::Error| crate::store::map_error(&db_path, e);
        let now = now_ms();
        let params_sha = params_hash(options);
        let defaults_json = serde_json::to_string(&options.defaults).expect("defaults serialize");
        let metadata_json = serde_json::to_string(&options.metadata).expect("metadata serializes");

        let tx = self.begin_immediate()?;
        tx.execute(
            "INSERT INTO jobs (state, source_name, source_sha256, params_sha256, model, defaults, metadata,
                               priority, max_attempts, created_at, validating_at, model_sha256, project)
             VALUES ('validating', ?1, '', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8, ?9, ?10)",
            params![source_name, params_sha, options.model, defaults_json, metadata_json, options.priority, options.max_attempts.max(1), now, options.model_sha256, options.project],
        )
        .map_err(|e| to_error(&e))?;
        let job = JobId(tx.last_insert_rowid());

        let mut items = 0_u64;
        let mut invalid = 0_u64;
        let mut errors: Vec<LineError> = Vec::new();
        {
            let mut insert_item = tx
                .prepare(
                    "INSERT INTO items (job_id, line, custom_id, endpoint, model, request, priority, updated_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )
                .map_err(|e| to_error(&e))?;
            let mut insert_error = tx
                .prepare("INSERT INTO input_errors (job_id, line, custom_id, message) VALUES (?1, ?2, ?3, ?4)")
                .map_err(|e| to_error(&e))?;
            let mut insert_grammar = tx
                .prepare("INSERT OR IGNORE INTO grammars (sha256, text) VALUES (?1, ?2)")
                .map_err(|e| to_error(&e))?;
            // Items of one job mostly share one grammar: stored once.
            let mut last_grammar = String::new();
            let mut first_use = tx
                .prepare("SELECT line FROM items WHERE job_id = ?1 AND custom_id = ?2")
                .map_err(|e| to_error(&e))?;
            for next in &mut *input {
                let parsed = next.map_err(|source| QueueError::Io {
                    path: source_name.into(),
                    source,
                })?;
                let error = match parsed {
                    Ok(item) => {
                        let NewItem {
                            line,
                            custom_id,
                            endpoint,
                            model,
                            request,
                        } = &item;
                        let (json, grammar) = crate::compact::compact_work_apart(request);
                        if let Some((sha, text)) = grammar
                            && sha != last_grammar
                        {
                            insert_grammar
                                .execute(params![sha, text])
                                .map_err(|e| to_error(&e))?;
                            last_grammar = sha;
                        }
                        match insert_item.execute(params![
                            job.0,
                            *line as i64,
                            custom_id,
                            endpoint,
                            model,
                            json,
                            options.priority,
                            now
                        ]) {
                            Ok(_) => {
                                items += 1;
                                continue;
                            }
                            Err(e)
                                if e.sqlite_error_code()
                                    == Some(ErrorCode::ConstraintViolation) =>
                            {
                                let first: Option<i64> = first_use
                                    .query_row(params![job.0, custom_id], |row| row.get(0))
                                    .optional()
                                    .map_err(|e| to_error(&e))?;
                                LineError::duplicate_custom_id(
                                    *line,
                                    custom_id,
                                    first.map(|l| l as u64),
                                )
                            }
                            Err(e) => return Err(to_error(&e)),
                        }
                    }
                    Err(error) => error,
                };
                invalid += 1;
                if options.skip_invalid {
                    insert_error
                        .execute(params![
                            job.0,
                            error.line as i64,
                            error.custom_id,
                            error.message
                        ])
                        .map_err(|e| to_error(&e))?;
                    if errors.len() >= KEEP_ERRORS {
                        continue;
                    }
                }
                errors.push(error);
            }
        }
        let lines = items + invalid;
        if items == 0 || (invalid > 0 && !options.skip_invalid) {
            // Dropping the transaction rolls everything back.
            return Err(QueueError::InvalidInput(InputReport {
                source_name: source_name.to_owned(),
                lines,
                errors,
            }));
        }
        let source_sha = input.source_sha256();
        if !options.force {
            let earlier: Option<(i64, String)> = tx
                .query_row(
                    "SELECT id, state FROM jobs WHERE source_sha256 = ?1 AND params_sha256 = ?2 AND id <> ?3
                     ORDER BY id DESC LIMIT 1",
                    params![source_sha, params_sha, job.0],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
                .map_err(|e| to_error(&e))?;
            if let Some((existing, state)) = earlier {
                return Err(QueueError::DuplicateJob {
                    existing: JobId(existing),
                    state: JobState::parse(&state).unwrap_or(JobState::InProgress),
                    source_name: source_name.to_owned(),
                });
            }
        }
        tx.execute(
            "UPDATE jobs SET source_sha256 = ?2, lines = ?3, invalid = ?4, state = 'in_progress', in_progress_at = ?5
             WHERE id = ?1",
            params![job.0, source_sha, lines as i64, invalid as i64, now_ms()],
        )
        .map_err(|e| to_error(&e))?;
        tx.commit().map_err(|e| to_error(&e))?;
        Ok(Submitted {
            job,
            items,
            invalid,
            first_errors: errors,
        })
    }
}
