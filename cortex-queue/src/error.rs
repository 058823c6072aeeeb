//! The queue's errors, and the report of a rejected input file line by line.

use std::fmt;
use std::path::PathBuf;

use crate::{ItemId, JobId, JobState};

/// Why a queue operation failed. Every variant says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// The database file could not be opened or set up.
    #[error("cannot open the job database {path}: {detail}")]
    Open {
        /// The database file.
        path: PathBuf,
        /// What failed.
        detail: String,
    },
    /// The database was written by a newer cortex whose schema this one does not know.
    #[error(
        "the job database {path} has schema version {found}; this cortex knows up to {supported}: use a newer cortex"
    )]
    NewerSchema {
        /// The database file.
        path: PathBuf,
        /// Its `user_version`.
        found: i64,
        /// The newest version this build knows.
        supported: i64,
    },
    /// The disk (or the database's size limit) is full; the write was rolled back.
    #[error("the disk holding {path} is full: nothing was written; free some space and try again")]
    DiskFull {
        /// The database file.
        path: PathBuf,
    },
    /// Other writers held the database for longer than the configured wait.
    #[error(
        "the job database {path} stayed busy for {seconds:.1} s (another process holds it); try again"
    )]
    Busy {
        /// The database file.
        path: PathBuf,
        /// How long this call waited.
        seconds: f64,
    },
    /// SQLite reported an error this crate does not expect.
    #[error("job database {path}: {detail}")]
    Database {
        /// The database file.
        path: PathBuf,
        /// SQLite's message.
        detail: String,
    },
    /// An export's file could not be written where it was asked for.
    #[error("cannot write {path}: {detail}; nothing was written")]
    Export {
        /// The file asked for.
        path: PathBuf,
        /// Why, in words.
        detail: String,
    },
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// No job has this id.
    #[error("no job {0} in this database (see `cortex list`)")]
    NoSuchJob(JobId),
    /// The job has no item on this input line.
    #[error("job {job} has no item on line {line}")]
    NoSuchItem {
        /// The job.
        job: JobId,
        /// The line asked for.
        line: u64,
    },
    /// The lease was taken over (expired and reclaimed) or the item was cancelled or finished.
    #[error(
        "item {item}: the lease (token {token}) is no longer held; its result was not recorded"
    )]
    LeaseLost {
        /// The item.
        item: ItemId,
        /// The stale lease token.
        token: i64,
    },
    /// The job is in a state that does not allow the action.
    #[error("job {job} is {state}: {hint}")]
    WrongState {
        /// The job.
        job: JobId,
        /// Its state.
        state: JobState,
        /// What cannot be done and why.
        hint: String,
    },
    /// The input file has bad lines and the submission was all-or-nothing.
    #[error("{0}")]
    InvalidInput(InputReport),
    /// The same file with the same parameters was submitted before.
    #[error(
        "{source_name} was already submitted with the same parameters as job {existing} ({state}); submit with force (`cortex submit --force`) to add it again"
    )]
    DuplicateJob {
        /// The earlier job.
        existing: JobId,
        /// Its state.
        state: JobState,
        /// The file's name.
        source_name: String,
    },
}

impl QueueError {
    /// `job` cannot do what was asked in `state`; `hint` says why and what to do.
    pub fn wrong_state(job: JobId, state: JobState, hint: impl Into<String>) -> Self {
        QueueError::WrongState {
            job,
            state,
            hint: hint.into(),
        }
    }

    /// `source_name` repeats job `existing` (its state as stored) with the
    /// same parameters.
    pub fn duplicate_job(existing: JobId, state: &str, source_name: &str) -> Self {
        QueueError::DuplicateJob {
            existing,
            state: JobState::parse(state).unwrap_or(JobState::InProgress),
            source_name: source_name.to_owned(),
        }
    }

    /// A short stable code for scripts (`disk_full`, `lease_lost`, ...).
    pub fn code(&self) -> &'static str {
        match self {
            QueueError::Open { .. } => "open_failed",
            QueueError::NewerSchema { .. } => "newer_schema",
            QueueError::DiskFull { .. } => "disk_full",
            QueueError::Busy { .. } => "busy",
            QueueError::Database { .. } => "database",
            QueueError::Export { .. } => "export_failed",
            QueueError::Io { .. } => "io",
            QueueError::NoSuchJob(_) => "no_such_job",
            QueueError::NoSuchItem { .. } => "no_such_item",
            QueueError::LeaseLost { .. } => "lease_lost",
            QueueError::WrongState { .. } => "wrong_state",
            QueueError::InvalidInput(_) => "invalid_input",
            QueueError::DuplicateJob { .. } => "duplicate_job",
        }
    }
}

/// Every bad line of a rejected input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputReport {
    /// The file's name as given.
    pub source_name: String,
    /// Non-blank lines read.
    pub lines: u64,
    /// The bad ones, in line order.
    pub errors: Vec<LineError>,
}

impl fmt::Display for InputReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.errors.is_empty() {
            return write!(
                f,
                "{}: no requests in the file; nothing was submitted",
                self.source_name
            );
        }
        let bad = self.errors.len();
        write!(
            f,
            "{}: {bad} of {} lines are invalid; nothing was submitted",
            self.source_name, self.lines
        )?;
        for error in &self.errors {
            write!(f, "\n  {error}")?;
        }
        Ok(())
    }
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

impl fmt::Display for LineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
