//! Which model a worker runs and what identifies it: a name for people and
//! the GGUF's SHA-256 for binding jobs to it (a path says nothing: the same
//! file may sit in many places, and a path may change its contents).

use std::path::{Path, PathBuf};

use cortex_engine::{DEFAULT_MODEL, ModelCache, ModelSpec, file_sha256, read_gguf};

use crate::WorkerError;

/// A model, resolved: where its file is and who it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelIdentity {
    /// The GGUF file.
    pub path: PathBuf,
    /// Its name in outputs and listings (a known model's file stem, else the file's stem).
    pub name: String,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
}

/// What a model setting names: `default`, a known model's name
/// (`gemma3-270m`), or a GGUF path.
fn known(setting: &str) -> Option<&'static ModelSpec> {
    if setting == "default" {
        Some(&DEFAULT_MODEL)
    } else {
        ModelSpec::by_name(setting)
    }
}

fn stem(path: &Path) -> String {
    path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    )
}

/// The name and SHA-256 of the model `setting` names, without fetching a
/// known model (its hash is known) — what a submit records.
pub fn identify(setting: &str, cache: &ModelCache) -> Result<(String, String), WorkerError> {
    if let Some(spec) = known(setting) {
        return Ok((stem(Path::new(spec.file_name)), spec.sha256.to_owned()));
    }
    let identity = resolve_path(Path::new(setting), cache)?;
    Ok((identity.name, identity.sha256))
}

/// The model `setting` names, fetched into `cache` and verified if it is a
/// known one, else checked to be a readable GGUF and hashed.
pub fn resolve(setting: &str, cache: &ModelCache) -> Result<ModelIdentity, WorkerError> {
    if let Some(spec) = known(setting) {
        let path = cache.ensure(spec).map_err(|source| WorkerError::Model {
            model: setting.to_owned(),
            detail: format!("{setting}: {source}"),
        })?;
        return Ok(ModelIdentity {
            name: stem(&path),
            path,
            sha256: spec.sha256.to_owned(),
        });
    }
    resolve_path(Path::new(setting), cache)
}

fn resolve_path(path: &Path, cache: &ModelCache) -> Result<ModelIdentity, WorkerError> {
    let model_error = |detail: String| WorkerError::Model {
        model: path.display().to_string(),
        detail,
    };
    read_gguf(path).map_err(|e| model_error(e.to_string()))?;
    let sha256 =
        cached_sha256(path, cache).map_err(|e| model_error(format!("{}: {e}", path.display())))?;
    Ok(ModelIdentity {
        path: path.to_owned(),
        name: stem(path),
        sha256,
    })
}

/// The file's SHA-256, remembered in the cache by canonical path, size and
/// modification time, so that a multi-gigabyte model is hashed once, not at
/// every start.
fn cached_sha256(path: &Path, cache: &ModelCache) -> Result<String, String> {
    let canonical = std::fs::canonicalize(path).map_err(|e| e.to_string())?;
    let meta = std::fs::metadata(&canonical).map_err(|e| e.to_string())?;
    let modified = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let key = format!("{} {} {modified}", canonical.display(), meta.len());
    let memo_dir = cache.dir().join("identities");
    // The memo's file name: a cheap stable hash of the key (FNV-1a).
    let name = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let memo = memo_dir.join(format!("{name:016x}"));
    if let Ok(text) = std::fs::read_to_string(&memo)
        && let Some((memo_key, sha)) = text.trim_end().rsplit_once('\n')
        && memo_key == key
    {
        return Ok(sha.to_owned());
    }
    let sha = file_sha256(&canonical).map_err(|e| e.to_string())?;
    // The memo is an optimisation: failing to write it costs a hash next time, nothing more.
    if std::fs::create_dir_all(&memo_dir).is_ok() {
        let partial = memo.with_extension(format!("tmp{}", std::process::id()));
        if std::fs::write(&partial, format!("{key}\n{sha}\n")).is_ok() {
            let _ = std::fs::rename(&partial, &memo);
        }
    }
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_models_are_identified_without_fetching() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModelCache::new(dir.path());
        let (name, sha) = identify("default", &cache).unwrap();
        assert_eq!(name, "SmolLM2-135M-Instruct.Q4_1");
        assert_eq!(sha, DEFAULT_MODEL.sha256);
        let (name, _) = identify("gemma3-270m", &cache).unwrap();
        assert_eq!(name, "gemma-3-270m-q4_k_m");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn a_path_that_is_not_a_gguf_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModelCache::new(dir.path().join("cache"));
        let file = dir.path().join("notes.txt");
        std::fs::write(&file, "hello").unwrap();
        let error = identify(file.to_str().unwrap(), &cache)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&format!("{}: not a GGUF", file.display())),
            "{error}"
        );
    }

    #[test]
    fn a_hash_is_remembered_until_the_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ModelCache::new(dir.path().join("cache"));
        let file = dir.path().join("m.bin");
        std::fs::write(&file, "hello").unwrap();
        let first = cached_sha256(&file, &cache).unwrap();
        assert_eq!(
            first,
            "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(cached_sha256(&file, &cache).unwrap(), first);
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, "hellO").unwrap();
        assert_ne!(cached_sha256(&file, &cache).unwrap(), first);
    }
}
