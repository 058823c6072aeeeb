//! Keeping the files directory tidy: temporary files that crashed writers
//! left behind are swept when the server starts, an upload's content whose
//! record is gone (a crash in a delete) too; failed batches and batch
//! exports older than the retention are pruned (an export is made again
//! from the queue when asked for), and a job's exports of an earlier end
//! go when it ends again.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{FileStore, lock};

/// Where `path` is written before it is renamed into place: hidden, with
/// the writer's process id, as the queue's exports are.
pub(crate) fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |name| name.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.tmp", std::process::id()))
}

/// The process that writes a temporary file named by [`temp_path`] (or by
/// earlier versions: `NAME.tmp.PID`), if the name is one.
fn temp_writer(name: &str) -> Option<u32> {
    let pid = if let Some(rest) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) {
        rest.rsplit_once('.')?.1
    } else {
        name.rsplit_once(".tmp.")?.1
    };
    pid.parse().ok()
}

/// Whether process `pid` may still be writing: alive, or unknowable
/// (without `/proc`, a temporary file is taken as abandoned after a day).
fn may_be_writing(pid: u32, modified: Option<SystemTime>) -> bool {
    if pid == std::process::id() {
        return true;
    }
    if Path::new("/proc/self").exists() {
        return Path::new(&format!("/proc/{pid}")).exists();
    }
    modified
        .and_then(|m| m.elapsed().ok())
        .is_none_or(|age| age < Duration::from_secs(24 * 3600))
}

/// What [`FileStore::prune`] removed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Pruned {
    pub(crate) failed_batches: usize,
    pub(crate) exports: usize,
    pub(crate) responses: usize,
}

impl FileStore {
    /// Removes abandoned temporary files, and uploads' content without a
    /// record; gives how many files went.
    pub(super) fn sweep(&self) -> std::io::Result<usize> {
        let mut swept = 0;
        for dir in [
            self.dir.clone(),
            self.dir.join("batches"),
            self.dir.join("exports"),
            self.dir.join("responses"),
        ] {
            for entry in std::fs::read_dir(&dir)? {
                let entry = entry?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let modified = entry.metadata().and_then(|m| m.modified()).ok();
                let abandoned = match temp_writer(&name) {
                    Some(pid) => !may_be_writing(pid, modified),
                    None => {
                        dir == self.dir
                            && name
                                .strip_suffix(".jsonl")
                                .is_some_and(|id| !self.info_path(id).exists())
                    }
                };
                if abandoned && std::fs::remove_file(entry.path()).is_ok() {
                    swept += 1;
                }
            }
        }
        Ok(swept)
    }

    /// Removes failed batches created, and exports and kept responses written, more than
    /// `retention` ago.
    pub(crate) fn prune(&self, retention: Duration) -> std::io::Result<Pruned> {
        let mut pruned = Pruned::default();
        let cutoff = SystemTime::now()
            .checked_sub(retention)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let cutoff_secs = cutoff
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let expired: Vec<String> = lock(&self.index)
            .failed
            .iter()
            .filter(|(_, failed)| {
                failed.batch["created_at"]
                    .as_i64()
                    .is_some_and(|t| t < cutoff_secs)
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            match std::fs::remove_file(self.failed_batch_path(&id)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            lock(&self.index).failed.remove(&id);
            pruned.failed_batches += 1;
        }
        for (sub, count) in [
            ("exports", &mut pruned.exports),
            ("responses", &mut pruned.responses),
        ] {
            for entry in std::fs::read_dir(self.dir.join(sub))? {
                let entry = entry?;
                let name = entry.file_name();
                if temp_writer(&name.to_string_lossy()).is_some() {
                    continue;
                }
                let old = entry
                    .metadata()
                    .and_then(|m| m.modified())
                    .is_ok_and(|modified| modified < cutoff);
                if old && std::fs::remove_file(entry.path()).is_ok() {
                    *count += 1;
                }
            }
        }
        Ok(pruned)
    }

    /// Removes the exports of `job` other than those of `current`
    /// (`batch_JOB-ENDED`): those of an earlier end, before a resume or a retry.
    pub(crate) fn forget_other_exports(&self, job: i64, current: &str) -> std::io::Result<()> {
        let prefix = format!("batch_{job}-");
        let keep = format!("{current}-");
        for entry in std::fs::read_dir(self.dir.join("exports"))? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&prefix) && !name.starts_with(&keep) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_names_give_their_writer() {
        let temp = temp_path(Path::new("/d/file-1.jsonl"));
        let name = temp.file_name().unwrap().to_string_lossy().into_owned();
        assert_eq!(temp_writer(&name), Some(std::process::id()));
        assert_eq!(temp_writer("file-1.tmp.42"), Some(42));
        assert_eq!(temp_writer(".batch_1-2-output.jsonl.77.tmp"), Some(77));
        assert_eq!(temp_writer("file-1.jsonl"), None);
        assert_eq!(temp_writer("file-1.json"), None);
    }
}
