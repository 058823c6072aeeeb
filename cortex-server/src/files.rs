//! Uploaded files on disk: `files/<id>.jsonl` with `<id>.json` beside it
//! (name, size, time, purpose, project), each written to a temporary name,
//! synced and renamed, so a crash never leaves half a file under its id.
//! Failed batches (an input file that did not validate) are kept the same
//! way in `batches/`, since they never became jobs; batch exports are in
//! `exports/`. Each upload and failed batch records the project it belongs
//! to (`default` for those from before projects).
//!
//! The records are read once, when the server starts, into an index kept
//! beside the files: a listing pages through the index, never through the
//! directory, and each project's stored bytes are known at once for its
//! quota. One server owns a files directory.

mod upkeep;
mod upload;

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cortex_openai::FileInfo;
use cortex_queue::DEFAULT_PROJECT;
use serde_json::{Value, json};

use crate::ServerError;
pub(crate) use upkeep::Pruned;
pub(crate) use upload::PendingUpload;

/// The upload route: its bodies are files (multipart, a larger limit,
/// a deadline between chunks rather than for the whole).
pub(crate) const ROUTE: &str = "/v1/files";

/// An upload's record on disk: its file object and its project.
#[derive(Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct StoredFile {
    #[serde(flatten)]
    pub(crate) info: FileInfo,
    #[serde(default = "default_project")]
    pub(crate) project: String,
}

/// A failed batch and its project.
#[derive(Clone)]
pub(crate) struct FailedBatch {
    pub(crate) batch: Value,
    pub(crate) project: String,
}

fn default_project() -> String {
    DEFAULT_PROJECT.to_owned()
}

/// Whether `project` is one that `filter` lets through (`None`: every one).
fn listed(filter: Option<&str>, project: &str) -> bool {
    filter.is_none_or(|only| only == project)
}

/// Where an upload sorts in a listing: newest first, ids breaking ties.
type Rank = (Reverse<i64>, Reverse<String>);

fn rank(info: &FileInfo) -> Rank {
    (Reverse(info.created_at), Reverse(info.id.clone()))
}

/// What the server knows of its files directory.
#[derive(Default)]
struct Index {
    uploads: HashMap<String, StoredFile>,
    newest_first: BTreeSet<Rank>,
    /// Bytes each project holds: stored uploads and uploads being received.
    used: HashMap<String, u64>,
    failed: HashMap<String, FailedBatch>,
}

impl Index {
    fn add_upload(&mut self, stored: StoredFile) {
        *self.used.entry(stored.project.clone()).or_default() += stored.info.bytes;
        self.newest_first.insert(rank(&stored.info));
        self.uploads.insert(stored.info.id.clone(), stored);
    }

    fn remove_upload(&mut self, id: &str) -> Option<StoredFile> {
        let stored = self.uploads.remove(id)?;
        self.newest_first.remove(&rank(&stored.info));
        self.release(&stored.project, stored.info.bytes);
        Some(stored)
    }

    fn release(&mut self, project: &str, bytes: u64) {
        if let Some(used) = self.used.get_mut(project) {
            *used = used.saturating_sub(bytes);
        }
    }
}

pub(crate) struct FileStore {
    dir: PathBuf,
    counter: AtomicU64,
    index: Arc<Mutex<Index>>,
    /// Most bytes of uploads one project may store (0: no limit).
    max_project_file_bytes: u64,
}

fn lock(index: &Mutex<Index>) -> MutexGuard<'_, Index> {
    index
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Writes `path` atomically: a temporary file in the same directory,
/// synced, renamed over `path`, the directory synced.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let temp = upkeep::temp_path(path);
    let result = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        sync_dir(path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Syncs the directory holding `path`, so a rename into it survives a crash.
fn sync_dir(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) => std::fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// Ids are letters, digits, `-` and `_` only, so one never names a path outside the directory.
fn safe(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl FileStore {
    /// Opens `dir` (made if missing): sweeps what crashed writers left
    /// behind and reads every record into the index.
    pub(crate) fn open(dir: &Path, max_project_file_bytes: u64) -> Result<Self, ServerError> {
        let io = |what: &Path| {
            let what = what.display().to_string();
            move |source| ServerError::Io {
                context: format!("cannot open {what}"),
                source,
            }
        };
        for sub in ["", "batches", "exports", "responses"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(io(&dir.join(sub)))?;
        }
        let store = Self {
            dir: dir.to_path_buf(),
            counter: AtomicU64::new(0),
            index: Arc::default(),
            max_project_file_bytes,
        };
        let swept = store.sweep().map_err(io(dir))?;
        if swept > 0 {
            tracing::info!(swept, "removed files that interrupted writes left behind");
        }
        store.load().map_err(io(dir))?;
        Ok(store)
    }

    /// Reads every upload and failed-batch record into the index.
    fn load(&self) -> std::io::Result<()> {
        let mut index = lock(&self.index);
        for id in ids_in(&self.dir)? {
            let read = std::fs::read(self.info_path(&id))
                .ok()
                .and_then(|bytes| serde_json::from_slice::<StoredFile>(&bytes).ok());
            match read {
                Some(stored) if stored.info.id == id => index.add_upload(stored),
                _ => tracing::warn!(id, "an upload's record cannot be read; it is not listed"),
            }
        }
        for id in ids_in(&self.dir.join("batches"))? {
            if let Some(failed) = self.read_failed_batch(&id) {
                index.failed.insert(id, failed);
            }
        }
        Ok(())
    }

    /// A new id with `prefix`: time, process and a counter, so ids from
    /// restarts and concurrent uploads never collide.
    pub(crate) fn new_id(&self, prefix: &str) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let micros = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        format!("{prefix}{micros:x}{:x}{n:x}", std::process::id())
    }

    /// Where an upload's content is (whether or not there is such an upload).
    pub(crate) fn content_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.jsonl"))
    }

    fn info_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn failed_batch_path(&self, id: &str) -> PathBuf {
        self.dir.join("batches").join(format!("{id}.json"))
    }

    /// An uploaded file's record (`None` when there is no such file).
    pub(crate) fn get(&self, id: &str) -> Option<StoredFile> {
        lock(&self.index).uploads.get(id).cloned()
    }

    /// The uploads of `project` (every project's with `None`), newest first.
    pub(crate) fn uploads(&self, project: Option<&str>) -> Vec<FileInfo> {
        let index = lock(&self.index);
        index
            .newest_first
            .iter()
            .filter_map(|(_, Reverse(id))| index.uploads.get(id))
            .filter(|stored| listed(project, &stored.project))
            .map(|stored| stored.info.clone())
            .collect()
    }

    /// Deletes an upload; false when there was none.
    pub(crate) fn delete(&self, id: &str) -> std::io::Result<bool> {
        if !safe(id) || !lock(&self.index).uploads.contains_key(id) {
            return Ok(false);
        }
        // The record goes first: content without a record is swept at start.
        match std::fs::remove_file(self.info_path(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let _ = std::fs::remove_file(self.content_path(id));
        Ok(lock(&self.index).remove_upload(id).is_some())
    }

    /// Where a batch's output (`output`) or error (`errors`) export is
    /// written; `batch` is `batch_JOB-ENDED`.
    pub(crate) fn export_path(&self, batch: &str, part: &str) -> PathBuf {
        self.dir
            .join("exports")
            .join(format!("{batch}-{part}.jsonl"))
    }

    fn response_path(&self, id: &str) -> PathBuf {
        self.dir.join("responses").join(format!("{id}.json"))
    }

    /// Keeps a `/v1/responses` answer of `project` (`resp_...`) for
    /// `GET /v1/responses/{id}`, until deleted or past the retention.
    pub(crate) fn save_response(
        &self,
        id: &str,
        response: &Value,
        project: &str,
    ) -> std::io::Result<()> {
        if !safe(id) {
            return Ok(());
        }
        let record = json!({ "project": project, "response": response });
        let json = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        write_atomically(&self.response_path(id), &json)
    }

    /// A kept response and its project.
    pub(crate) fn response(&self, id: &str) -> Option<(String, Value)> {
        if !safe(id) {
            return None;
        }
        let bytes = std::fs::read(self.response_path(id)).ok()?;
        let mut record: Value = serde_json::from_slice(&bytes).ok()?;
        let project = record["project"].as_str()?.to_owned();
        Some((project, record["response"].take()))
    }

    /// Deletes a kept response; false when there was none.
    pub(crate) fn delete_response(&self, id: &str) -> std::io::Result<bool> {
        if !safe(id) {
            return Ok(false);
        }
        match std::fs::remove_file(self.response_path(id)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Keeps a failed batch of `project` (it never became a job).
    pub(crate) fn save_failed_batch(
        &self,
        id: &str,
        batch: &Value,
        project: &str,
    ) -> std::io::Result<()> {
        let record = json!({ "project": project, "batch": batch });
        let json = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
        write_atomically(&self.failed_batch_path(id), &json)?;
        lock(&self.index).failed.insert(
            id.to_owned(),
            FailedBatch {
                batch: batch.clone(),
                project: project.to_owned(),
            },
        );
        Ok(())
    }

    fn read_failed_batch(&self, id: &str) -> Option<FailedBatch> {
        let bytes = std::fs::read(self.failed_batch_path(id)).ok()?;
        let mut record: Value = serde_json::from_slice(&bytes).ok()?;
        let project = record["project"].as_str().map(str::to_owned);
        match (project, record.get_mut("batch")) {
            (Some(project), Some(batch)) if batch.is_object() => Some(FailedBatch {
                project,
                batch: batch.take(),
            }),
            // Records from before projects are the batch object itself.
            _ => Some(FailedBatch {
                batch: record,
                project: default_project(),
            }),
        }
    }

    pub(crate) fn failed_batch(&self, id: &str) -> Option<FailedBatch> {
        lock(&self.index).failed.get(id).cloned()
    }

    /// The failed batches of `project` (every project's with `None`).
    pub(crate) fn failed_batches(&self, project: Option<&str>) -> Vec<Value> {
        lock(&self.index)
            .failed
            .values()
            .filter(|failed| listed(project, &failed.project))
            .map(|failed| failed.batch.clone())
            .collect()
    }
}

/// The ids of the `ID.json` records in `dir` whose ids are safe.
fn ids_in(dir: &Path) -> std::io::Result<Vec<String>> {
    let mut ids = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        if let Some(id) = name.to_string_lossy().strip_suffix(".json")
            && safe(id)
        {
            ids.push(id.to_owned());
        }
    }
    Ok(ids)
}
