//! What a job's submission is made of (its parsed lines, its options, what
//! came of it) and the accounting every driver's submit loop shares.

use std::collections::BTreeMap;

use cortex_request::{ChatTemplateChoice, Work};
use sha2::{Digest, Sha256};

use crate::{DEFAULT_PROJECT, InputReport, JobDefaults, JobId, LineError, QueueError, Result};

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

/// What a reader yields per non-blank line.
pub type LineResult = std::result::Result<NewItem, LineError>;

/// A job's input, parsed line by line by the caller (the wire-format crate
/// knows the line formats; the queue stores what they mean).
pub trait ItemSource: Iterator<Item = std::io::Result<LineResult>> {
    /// SHA-256 (hex) of the whole input, once every line was read: with the
    /// submit parameters it identifies a resubmission of the same file.
    fn source_sha256(&mut self) -> String;
}

/// Attempts an item gets before a retryable failure is final, unless a
/// job says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;

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
    /// The chat template chats are rendered with instead of the model's
    /// own (a name or a template's text), when the submitting side chose
    /// one. A worker renders with its own, so this only tells two
    /// submissions apart: the same file under another template is
    /// another job, never "submitted before".
    pub chat_template: Option<String>,
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
    /// Why chat lines cannot run, when the job's model cannot render a
    /// chat (its GGUF has no template and none was chosen): such lines are
    /// refused at submit with this reason, not failed later.
    pub chats_refused: Option<String>,
    /// How long the job has to finish, from its submission; what has not
    /// finished then fails with [`crate::BATCH_EXPIRED`]. `None`: for ever.
    pub completion_window: Option<crate::CompletionWindow>,
    /// Where to announce the job's end (`batch.completed`, `batch.failed`,
    /// `batch.cancelled`, `batch.expired`): a webhook URL. `None`: nowhere.
    pub notify_url: Option<String>,
    /// Where to write the job's results when it ends (a local path or an
    /// object's URL, written by a worker or server of the queue, at least
    /// once). `None`: only when asked.
    pub output_url: Option<String>,
}

impl SubmitOptions {
    /// Defaults for `model`: all-or-nothing, 3 attempts, priority 0.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            model_sha256: None,
            defaults: JobDefaults::default(),
            chat_template: None,
            metadata: BTreeMap::new(),
            project: DEFAULT_PROJECT.to_owned(),
            priority: 0,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            skip_invalid: false,
            force: false,
            chats_refused: None,
            completion_window: None,
            notify_url: None,
            output_url: None,
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

/// Identifies "the same parameters" for duplicate detection.
pub fn params_hash(options: &SubmitOptions) -> String {
    // The model's template follows from its name: left out, so the
    // hashes of jobs from before it was kept stay as they were.
    let defaults = JobDefaults {
        chat_template: ChatTemplateChoice::Engine,
        ..options.defaults.clone()
    };
    let mut canonical = serde_json::json!({
        "model": options.model,
        "model_sha256": options.model_sha256,
        "defaults": defaults,
    });
    // Only what is not the default, so the hashes of earlier jobs stay as
    // they were: another project's, another chat template's.
    if options.project != DEFAULT_PROJECT {
        canonical["project"] = options.project.clone().into();
    }
    if let Some(template) = &options.chat_template {
        canonical["chat_template"] = template.clone().into();
    }
    format!("{:x}", Sha256::digest(canonical.to_string()))
}

/// What a driver does with each line of a submission, inside its
/// transaction: the writes; [`store_lines`] is the loop around them.
pub trait LineSink {
    /// Stores a valid line's item. `request` is its work as stored (see
    /// [`crate::driver::compact_work_apart`]) and `grammar` the grammar
    /// stored apart from it (SHA-256, text). Returns the line's error
    /// instead when it cannot be stored: its `custom_id` is an earlier
    /// line's.
    fn item(
        &mut self,
        item: &NewItem,
        request: &str,
        grammar: Option<(String, &str)>,
    ) -> Result<Option<LineError>>;
    /// Records a bad line as a failed item of the job (with
    /// [`SubmitOptions::skip_invalid`]).
    fn bad_line(&mut self, error: LineError) -> Result<()>;
}

/// Reads `input` (named `source_name` in messages) to its end into `sink`,
/// counting in `tally`: the submit loop every driver shares.
pub fn store_lines(
    input: &mut dyn ItemSource,
    source_name: &str,
    tally: &mut SubmitTally,
    sink: &mut dyn LineSink,
) -> Result<()> {
    for next in input {
        let parsed = next.map_err(|source| QueueError::Io {
            path: source_name.into(),
            source,
        })?;
        let error = match parsed {
            Ok(item) => {
                let (request, grammar) = crate::compact::compact_work_apart(&item.request);
                match sink.item(&item, &request, grammar)? {
                    None => {
                        tally.stored();
                        continue;
                    }
                    Some(error) => error,
                }
            }
            Err(error) => error,
        };
        if let Some(error) = tally.bad_line(error) {
            sink.bad_line(error)?;
        }
    }
    Ok(())
}

/// How many bad lines a submit keeps for its message.
pub const KEEP_ERRORS: usize = 100;

/// The accounting of a submit loop, the same on every driver: items
/// stored, bad lines counted, the bad lines a message names (all of them
/// when they reject the input, the first [`KEEP_ERRORS`] when they are
/// recorded as failed), and whether the input is accepted at all.
#[derive(Debug)]
pub struct SubmitTally {
    items: u64,
    invalid: u64,
    errors: Vec<LineError>,
    skip_invalid: bool,
}

impl SubmitTally {
    /// The tally of a submission under `options`.
    pub fn new(options: &SubmitOptions) -> Self {
        Self {
            items: 0,
            invalid: 0,
            errors: Vec::new(),
            skip_invalid: options.skip_invalid,
        }
    }

    /// Counts an item stored.
    pub fn stored(&mut self) {
        self.items += 1;
    }

    /// Counts a bad line. Returns it when the job keeps its bad lines
    /// ([`SubmitOptions::skip_invalid`]), for the driver to record as failed.
    pub fn bad_line(&mut self, error: LineError) -> Option<LineError> {
        self.invalid += 1;
        if !self.skip_invalid {
            self.errors.push(error);
            return None;
        }
        if self.errors.len() < KEEP_ERRORS {
            self.errors.push(error.clone());
        }
        Some(error)
    }

    /// Once every line is in: the job's `(lines, invalid)` counts, or the
    /// report that rejects the whole input (no valid line, or bad lines
    /// without `skip_invalid`), after which the driver rolls back.
    pub fn accepted(&mut self, source_name: &str) -> Result<(u64, u64)> {
        let lines = self.items + self.invalid;
        if self.items == 0 || (self.invalid > 0 && !self.skip_invalid) {
            return Err(QueueError::InvalidInput(InputReport {
                source_name: source_name.to_owned(),
                lines,
                errors: std::mem::take(&mut self.errors),
            }));
        }
        Ok((lines, self.invalid))
    }

    /// What the submission of `job` gave.
    pub fn submitted(self, job: JobId) -> Submitted {
        Submitted {
            job,
            items: self.items,
            invalid: self.invalid,
            first_errors: self.errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_template_is_stored_with_its_defaults_and_left_out_of_its_hash() {
        let plain = SubmitOptions::new("m");
        let mut chosen = SubmitOptions::new("m");
        chosen.defaults.chat_template = ChatTemplateChoice::Given("{{ messages }}".into());
        assert_eq!(params_hash(&plain), params_hash(&chosen));
        let stored = serde_json::to_string(&chosen.defaults).unwrap();
        let read: JobDefaults = serde_json::from_str(&stored).unwrap();
        assert_eq!(read, chosen.defaults);
        chosen.defaults.chat_template = ChatTemplateChoice::ModelFile;
        let stored = serde_json::to_string(&chosen.defaults).unwrap();
        assert_eq!(
            serde_json::from_str::<JobDefaults>(&stored).unwrap(),
            chosen.defaults
        );
        // A job stored before renders with its engine's, as it did then.
        let before = serde_json::to_string(&JobDefaults::default()).unwrap();
        assert!(!before.contains("chat_template"), "{before}");
        let read: JobDefaults = serde_json::from_str("{}").unwrap();
        assert_eq!(read.chat_template, ChatTemplateChoice::Engine);
    }
}
