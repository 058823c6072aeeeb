//! Uploaded files on disk: `files/<id>.jsonl` with `<id>.json` beside it
//! (name, size, time, purpose), each written to a temporary name, synced
//! and renamed, so a crash never leaves half a file under its id. Failed
//! batches (an input file that did not validate) are kept the same way,
//! since they never became jobs. Each upload and failed batch records the
//! project it belongs to (`default` for those from before projects).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cortex_openai::FileInfo;
use cortex_queue::DEFAULT_PROJECT;
use serde_json::{Value, json};

use crate::ServerError;

/// An upload's record on disk: its file object and its project.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct StoredFile {
    #[serde(flatten)]
    pub(crate) info: FileInfo,
    #[serde(default = "default_project")]
    pub(crate) project: String,
}

/// A failed batch and its project.
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

pub(crate) struct FileStore {
    dir: PathBuf,
    counter: AtomicU64,
}

/// Writes `path` atomically: a temporary file in the same directory,
/// synced, renamed over `path`, the directory synced.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let temp = path.with_extension(format!("tmp.{}", std::process::id()));
    let result = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Ids are letters, digits, `-` and `_` only, so one never names a path outside the directory.
fn safe(id: &str) -> bool {
    !id.is_empty()
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl FileStore {
    pub(crate) fn open(dir: &Path) -> Result<Self, ServerError> {
        for sub in ["", "batches", "exports"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|source| ServerError::Io {
                context: format!("cannot create {}", dir.join(sub).display()),
                source,
            })?;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            counter: AtomicU64::new(0),
        })
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

    /// Stores an upload of `project`.
    pub(crate) fn create(
        &self,
        filename: &str,
        purpose: &str,
        bytes: &[u8],
        project: &str,
    ) -> std::io::Result<FileInfo> {
        let stored = StoredFile {
            info: FileInfo {
                id: self.new_id("file-"),
                bytes: bytes.len() as u64,
                created_at: cortex_queue::now_ms() / 1000,
                filename: filename.to_owned(),
                purpose: purpose.to_owned(),
            },
            project: project.to_owned(),
        };
        write_atomically(&self.content_path(&stored.info.id), bytes)?;
        let json = serde_json::to_vec(&stored).map_err(std::io::Error::other)?;
        write_atomically(&self.info_path(&stored.info.id), &json)?;
        Ok(stored.info)
    }

    /// An uploaded file's record (`None` when there is no such file).
    pub(crate) fn get(&self, id: &str) -> Option<StoredFile> {
        if !safe(id) {
            return None;
        }
        let bytes = std::fs::read(self.info_path(id)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// The uploaded files of `project` (every project's with `None`), newest first.
    pub(crate) fn list(&self, project: Option<&str>) -> std::io::Result<Vec<FileInfo>> {
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name.strip_suffix(".json")
                && let Some(stored) = self.get(id)
                && listed(project, &stored.project)
            {
                files.push(stored.info);
            }
        }
        files.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
        Ok(files)
    }

    /// Deletes an upload; false when there was none.
    pub(crate) fn delete(&self, id: &str) -> std::io::Result<bool> {
        if !safe(id) {
            return Ok(false);
        }
        match std::fs::remove_file(self.info_path(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        }
        let _ = std::fs::remove_file(self.content_path(id));
        Ok(true)
    }

    /// Where a batch's output (`output`) or error (`errors`) export is written.
    pub(crate) fn export_path(&self, batch: &str, part: &str) -> PathBuf {
        self.dir
            .join("exports")
            .join(format!("{batch}-{part}.jsonl"))
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
        write_atomically(&self.dir.join("batches").join(format!("{id}.json")), &json)
    }

    pub(crate) fn failed_batch(&self, id: &str) -> Option<FailedBatch> {
        if !safe(id) {
            return None;
        }
        let bytes = std::fs::read(self.dir.join("batches").join(format!("{id}.json"))).ok()?;
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

    /// The failed batches of `project` (every project's with `None`).
    pub(crate) fn failed_batches(&self, project: Option<&str>) -> std::io::Result<Vec<Value>> {
        let mut batches = Vec::new();
        for entry in std::fs::read_dir(self.dir.join("batches"))? {
            let name = entry?.file_name();
            if let Some(id) = name.to_string_lossy().strip_suffix(".json")
                && let Some(failed) = self.failed_batch(id)
                && listed(project, &failed.project)
            {
                batches.push(failed.batch);
            }
        }
        Ok(batches)
    }
}
