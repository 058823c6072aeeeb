//! A file written where the user named it, without harming what the name
//! is: a regular file or a new path is written under a temporary name and
//! renamed over it once whole (a reader never sees half a file, a failure
//! leaves it as it was); anything else, a device (`/dev/null`), a FIFO, this
//! process's own descriptors (`/dev/stdout`), is written straight into, and
//! a symbolic link is followed, so the link stays and its target is written.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, ErrorKind};
use std::path::{Path, PathBuf};

use crate::{QueueError, Result};

/// How many links a name may pass through, as the kernel allows (`ELOOP`).
const MAX_LINKS: usize = 40;

/// Where the bytes of an [`OutputFile`] go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A regular file or a new path (a link's target, once followed):
    /// written beside it and renamed over it.
    Replace(PathBuf),
    /// Something that is not a regular file: written into as it is.
    Stream,
}

impl Destination {
    /// Where the name `path` leads, following links by hand: a link into
    /// `/proc` (`/dev/stdout` is `/proc/self/fd/1`) names a descriptor this
    /// process holds, which is written into, whatever file it is, so that
    /// a shell's `>>` or a pipe gets the bytes where it expects them.
    pub fn of(path: &Path) -> std::io::Result<Self> {
        let mut current = path.to_path_buf();
        for _ in 0..MAX_LINKS {
            let meta = match std::fs::symlink_metadata(&current) {
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    return Ok(Self::Replace(current));
                }
                Err(e) => return Err(e),
                Ok(meta) => meta,
            };
            let kind = meta.file_type();
            if kind.is_symlink() {
                let link = std::fs::read_link(&current)?;
                current = match current.parent() {
                    Some(dir) if link.is_relative() => dir.join(link),
                    _ => link,
                };
                if current.starts_with("/proc") {
                    return Ok(Self::Stream);
                }
            } else if kind.is_file() {
                return Ok(Self::Replace(current));
            } else if kind.is_dir() {
                return Err(std::io::Error::new(
                    ErrorKind::IsADirectory,
                    "it is a directory",
                ));
            } else {
                return Ok(Self::Stream);
            }
        }
        Err(std::io::Error::other("too many levels of symbolic links"))
    }
}

/// A file being written to the name it was asked under (see the module).
pub struct OutputFile {
    path: PathBuf,
    /// The temporary file and the file it replaces, when it replaces one.
    replace: Option<(PathBuf, PathBuf)>,
    writer: Option<BufWriter<File>>,
}

impl OutputFile {
    /// Opens `path` for writing; a place where nothing can be written is
    /// refused here, before anything is written anywhere.
    pub fn create(path: &Path) -> Result<Self> {
        let refused = |detail: String| QueueError::Export {
            path: path.to_path_buf(),
            detail,
        };
        let destination = Destination::of(path).map_err(|e| refused(e.to_string()))?;
        let (file, replace) = match destination {
            Destination::Stream => {
                // Appending writes at the end of what a shell's `>>` left, and
                // changes nothing for a device or a pipe.
                let file = OpenOptions::new()
                    .append(true)
                    .open(path)
                    .map_err(|e| refused(e.to_string()))?;
                (file, None)
            }
            Destination::Replace(target) => {
                let name = target
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "output".into());
                let temp = target.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
                let file = File::create(&temp).map_err(|source| {
                    let dir = target
                        .parent()
                        .filter(|d| !d.as_os_str().is_empty())
                        .unwrap_or(Path::new("."));
                    refused(format!(
                        "no file can be created in {} ({source})",
                        dir.display()
                    ))
                })?;
                (file, Some((temp, target)))
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            replace,
            writer: Some(BufWriter::with_capacity(1 << 16, file)),
        })
    }

    /// Whether the file replaces a regular file (or makes a new one), which
    /// can be read back once committed; a stream cannot.
    pub fn is_regular(&self) -> bool {
        self.replace.is_some()
    }

    /// The name it was asked under.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// An I/O failure on this file, named by the path asked for.
    pub fn io_error(&self, source: std::io::Error) -> QueueError {
        QueueError::Io {
            path: self.path.clone(),
            source,
        }
    }

    /// Where the bytes are written, until [`OutputFile::flush`].
    pub fn writer(&mut self) -> &mut BufWriter<File> {
        self.writer.as_mut().expect("written before it is flushed")
    }

    /// Writes out what is buffered and, for a file, syncs it to disk.
    pub fn flush(&mut self) -> Result<()> {
        let writer = self.writer.take().expect("flushed once");
        let file = writer
            .into_inner()
            .map_err(|e| self.io_error(e.into_error()))?;
        match &self.replace {
            Some(_) => file.sync_all().map_err(|e| self.io_error(e)),
            // A pipe or a device cannot be synced (EINVAL); its bytes are out.
            None => Ok(()),
        }
    }

    /// Puts a flushed file in place: renamed over the file it replaces,
    /// durably (a stream has nothing left to do).
    pub fn commit(mut self) -> Result<()> {
        debug_assert!(self.writer.is_none(), "flushed before it is committed");
        let Some((temp, target)) = self.replace.take() else {
            return Ok(());
        };
        if let Err(e) = std::fs::rename(&temp, &target) {
            let _ = std::fs::remove_file(&temp);
            return Err(self.io_error(e));
        }
        if let Some(dir) = target.parent().filter(|d| !d.as_os_str().is_empty()) {
            // Makes the rename itself durable; not every platform can open a directory.
            if let Ok(dir) = File::open(dir) {
                let _ = dir.sync_all();
            }
        }
        Ok(())
    }

    /// Flushes and commits: a file written alone.
    pub fn finish(mut self) -> Result<()> {
        self.flush()?;
        self.commit()
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        // Not committed: the temporary file goes (after a commit it is gone).
        if let Some((temp, _)) = &self.replace {
            let _ = std::fs::remove_file(temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::unix::fs::FileTypeExt as _;

    use super::*;

    fn write(path: &Path, text: &str) {
        let mut file = OutputFile::create(path).unwrap();
        file.writer().write_all(text.as_bytes()).unwrap();
        file.finish().unwrap();
    }

    #[test]
    fn a_new_path_and_a_regular_file_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        write(&path, "one\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "one\n");
        write(&path, "two\n");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "two\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn an_unfinished_file_leaves_the_old_one_as_it_was() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("out.jsonl");
        std::fs::write(&path, "old\n").unwrap();
        let mut file = OutputFile::create(&path).unwrap();
        file.writer().write_all(b"half").unwrap();
        drop(file);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old\n");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_symbolic_link_stays_and_its_target_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target.jsonl");
        std::fs::write(&target, "old\n").unwrap();
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink("target.jsonl", &link).unwrap();
        write(&link, "new\n");
        assert!(
            std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "new\n");
        // A link to a file not made yet makes it.
        let dangling = dir.path().join("dangling.jsonl");
        std::os::unix::fs::symlink("later.jsonl", &dangling).unwrap();
        write(&dangling, "made\n");
        assert_eq!(
            std::fs::read_to_string(dir.path().join("later.jsonl")).unwrap(),
            "made\n"
        );
    }

    #[test]
    fn a_device_is_written_into_and_stays_a_device() {
        let null = Path::new("/dev/null");
        assert_eq!(Destination::of(null).unwrap(), Destination::Stream);
        let file = OutputFile::create(null).unwrap();
        assert!(!file.is_regular());
        drop(file);
        write(null, "gone\n");
        assert!(
            std::fs::metadata(null)
                .unwrap()
                .file_type()
                .is_char_device()
        );
        assert_eq!(
            Destination::of(Path::new("/dev/stdout")).unwrap(),
            Destination::Stream
        );
    }

    #[test]
    fn a_fifo_is_written_into() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let reader = {
            let fifo = fifo.clone();
            std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
        };
        write(&fifo, "through\n");
        assert_eq!(reader.join().unwrap(), "through\n");
        assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    }

    #[test]
    fn a_directory_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let error = OutputFile::create(dir.path()).err().unwrap().to_string();
        assert!(error.contains("it is a directory"), "{error}");
    }
}
