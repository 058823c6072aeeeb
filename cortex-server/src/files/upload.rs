//! An upload being received: written to a temporary file as it arrives,
//! its bytes counted against its project's quota as they come (so that
//! concurrent uploads cannot together go over it), and stored under a new
//! id only once it is complete; dropped unfinished, it leaves nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cortex_openai::FileInfo;

use super::{FileStore, Index, StoredFile, lock, sync_dir, upkeep, write_atomically};

/// An upload would take its project over [`FileStore`]'s quota.
#[derive(Debug)]
pub(crate) struct QuotaExceeded {
    pub(crate) project: String,
    pub(crate) quota: u64,
}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "project {:?} would store more than its quota of {} bytes of files (max_project_file_bytes); delete files it no longer needs",
            self.project, self.quota
        )
    }
}

pub(crate) struct PendingUpload {
    index: Arc<Mutex<Index>>,
    quota: u64,
    project: String,
    temp: PathBuf,
    bytes: u64,
    stored: bool,
}

impl FileStore {
    /// Starts receiving an upload of `project`: the temporary file it is
    /// written to, and its account.
    pub(crate) fn begin_upload(
        &self,
        project: &str,
    ) -> std::io::Result<(PendingUpload, std::fs::File)> {
        let temp = upkeep::temp_path(&self.dir.join(self.new_id("upload-")));
        let file = std::fs::File::create(&temp)?;
        let pending = PendingUpload {
            index: Arc::clone(&self.index),
            quota: self.max_project_file_bytes,
            project: project.to_owned(),
            temp,
            bytes: 0,
            stored: false,
        };
        Ok((pending, file))
    }

    /// Stores a received upload under a new id: the content synced and
    /// renamed into place, then its record, then the index.
    pub(crate) fn finish_upload(
        &self,
        mut pending: PendingUpload,
        file: std::fs::File,
        filename: &str,
        purpose: &str,
    ) -> std::io::Result<FileInfo> {
        file.sync_all()?;
        drop(file);
        let stored = StoredFile {
            info: FileInfo {
                id: self.new_id("file-"),
                bytes: pending.bytes,
                created_at: cortex_queue::now_ms() / 1000,
                filename: filename.to_owned(),
                purpose: purpose.to_owned(),
            },
            project: pending.project.clone(),
        };
        let content = self.content_path(&stored.info.id);
        std::fs::rename(&pending.temp, &content)?;
        sync_dir(&content)?;
        let json = serde_json::to_vec(&stored).map_err(std::io::Error::other)?;
        if let Err(error) = write_atomically(&self.info_path(&stored.info.id), &json) {
            let _ = std::fs::remove_file(&content);
            return Err(error);
        }
        let mut index = lock(&self.index);
        // Its bytes were counted as they came: the reservation becomes the upload.
        index.release(&pending.project, pending.bytes);
        index.add_upload(stored.clone());
        pending.stored = true;
        Ok(stored.info)
    }
}

impl PendingUpload {
    /// Counts `more` bytes received, refusing them beyond the quota.
    pub(crate) fn grow(&mut self, more: u64) -> Result<(), QuotaExceeded> {
        let mut index = lock(&self.index);
        let used = index.used.entry(self.project.clone()).or_default();
        if self.quota > 0 && used.saturating_add(more) > self.quota {
            return Err(QuotaExceeded {
                project: self.project.clone(),
                quota: self.quota,
            });
        }
        *used += more;
        self.bytes += more;
        Ok(())
    }
}

impl Drop for PendingUpload {
    fn drop(&mut self) {
        if !self.stored {
            let _ = std::fs::remove_file(&self.temp);
            lock(&self.index).release(&self.project, self.bytes);
        }
    }
}
