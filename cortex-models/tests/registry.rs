//! The registry on disk: names over shared blobs, Modelfiles, model
//! directories, and damage that is reported without losing a model file.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use cortex_models::{
    ModelError, ModelSettings, Modelfile, Origin, Registry, RegistryError, file_sha256,
};

/// A header-only GGUF (no tensors) that `read_gguf` accepts.
fn tiny_gguf(path: &Path, name: &str) -> PathBuf {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    let kv = [("general.architecture", "llama"), ("general.name", name)];
    bytes.extend((kv.len() as u64).to_le_bytes());
    for (key, value) in kv {
        bytes.extend((key.len() as u64).to_le_bytes());
        bytes.extend(key.as_bytes());
        bytes.extend(8u32.to_le_bytes());
        bytes.extend((value.len() as u64).to_le_bytes());
        bytes.extend(value.as_bytes());
    }
    // The tensor data (none) starts at the next alignment boundary.
    bytes.resize(bytes.len().next_multiple_of(32) + 32, 0);
    fs::write(path, bytes).unwrap();
    path.to_owned()
}

fn names(registry: &Registry) -> Vec<String> {
    registry
        .list()
        .models
        .iter()
        .map(|m| m.name.to_string())
        .collect()
}

#[test]
fn names_share_a_blob_until_the_last_goes() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(dir.path().join("models"));
    let gguf = tiny_gguf(&dir.path().join("mine.gguf"), "mine");
    let sha = file_sha256(&gguf).unwrap();

    let added = registry
        .add("mine", &gguf, ModelSettings::default())
        .unwrap();
    assert_eq!(added.name.to_string(), "mine:latest");
    assert_eq!(added.sha256, sha);
    assert!(added.path.starts_with(registry.root()));
    assert!(gguf.exists(), "the source file is left where it was");

    let copy = registry.copy("mine", "other:v1").unwrap();
    assert_eq!(copy.sha256, sha);
    assert_eq!(names(&registry), ["mine:latest", "other:v1"]);
    assert_eq!(registry.resolve("MINE").unwrap().sha256, sha);
    assert_eq!(registry.identify("other:v1").unwrap().sha256, sha);

    let removed = registry.remove("mine").unwrap();
    assert!(!removed.blob_removed);
    assert!(added.path.exists());
    assert_eq!(registry.resolve("other:v1").unwrap().path, added.path);
    let removed = registry.remove("other:v1").unwrap();
    assert!(removed.blob_removed);
    assert!(!added.path.exists());
    assert!(names(&registry).is_empty());
}

#[test]
fn a_modelfile_sets_system_and_parameters_over_its_base() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(dir.path().join("models"));
    tiny_gguf(&dir.path().join("m.gguf"), "m");
    let base =
        Modelfile::parse("FROM ./m.gguf\nSYSTEM Be brief.\nPARAMETER temperature 0.5\n").unwrap();
    let created = registry.create("brief", &base, dir.path()).unwrap();
    assert_eq!(created.settings.system.as_deref(), Some("Be brief."));
    let newer = Modelfile::parse("FROM brief\nPARAMETER top_k 3\n").unwrap();
    let derived = registry.create("brief:k3", &newer, dir.path()).unwrap();
    assert_eq!(derived.sha256, created.sha256);
    assert_eq!(derived.settings.system.as_deref(), Some("Be brief."));
    assert_eq!(derived.settings.parameters.len(), 2);
    let Origin::Registered { from } = &derived.origin else {
        panic!("{:?}", derived.origin)
    };
    assert_eq!(from, "created from brief");
}

#[test]
fn unknown_names_list_what_there_is() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(dir.path().join("models"));
    tiny_gguf(&dir.path().join("m.gguf"), "m");
    registry
        .add("mine", &dir.path().join("m.gguf"), ModelSettings::default())
        .unwrap();
    let error = registry.resolve("gpt-4o").unwrap_err().to_string();
    assert_eq!(
        error,
        "no model is called \"gpt-4o\" (installed: mine:latest; fetched on first use: smollm2-135m, gemma3-270m)"
    );
    let error = registry.remove("gpt-4o").unwrap_err().to_string();
    assert!(
        error.starts_with("no model is called \"gpt-4o\""),
        "{error}"
    );
    let error = registry.resolve("bad name").unwrap_err().to_string();
    assert!(
        error.starts_with("\"bad name\" is not a model name"),
        "{error}"
    );
}

#[test]
fn files_in_model_directories_are_listed_not_owned() {
    let dir = tempfile::tempdir().unwrap();
    let shelf = dir.path().join("shelf");
    fs::create_dir(&shelf).unwrap();
    let gguf = tiny_gguf(&shelf.join("Tiny Model.Q4.gguf"), "tiny");
    fs::write(shelf.join("notes.txt"), "not a model").unwrap();
    let registry = Registry::open(dir.path().join("models")).with_model_dirs(vec![shelf.clone()]);
    assert_eq!(names(&registry), ["Tiny-Model.Q4:latest"]);
    let found = registry.resolve("tiny-model.q4").unwrap();
    assert_eq!(found.path, gguf);
    assert_eq!(found.origin, Origin::Discovered { dir: shelf });
    let error = registry.remove("Tiny-Model.Q4").unwrap_err();
    assert!(
        matches!(error, RegistryError::NotRegistered { .. }),
        "{error}"
    );
    assert!(gguf.exists());
    // A copy brings the file into the store under a name of its own.
    let copy = registry.copy("Tiny-Model.Q4", "tiny").unwrap();
    assert_ne!(copy.path, gguf);
    assert!(copy.path.exists());
}

#[test]
fn a_damaged_manifest_is_named_and_keeps_every_model_file() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(dir.path().join("models"));
    let gguf = tiny_gguf(&dir.path().join("m.gguf"), "m");
    let first = registry
        .add("first", &gguf, ModelSettings::default())
        .unwrap();
    registry.copy("first", "second").unwrap();
    let manifest = registry.root().join("manifests/second/latest.json");
    fs::File::create(&manifest)
        .unwrap()
        .write_all(b"{\"schema\": 1, \"model\": ")
        .unwrap();

    let listing = registry.list();
    assert_eq!(listing.models.len(), 1);
    let damage = listing.damaged[0].to_string();
    assert!(
        damage.starts_with(&format!(
            "{}: damaged registry entry (not a manifest: ",
            manifest.display()
        )),
        "{damage}"
    );
    assert!(
        damage.ends_with("no model file was removed: fix or delete this file"),
        "{damage}"
    );
    let error = registry.resolve("second").unwrap_err();
    assert!(matches!(error, RegistryError::Damaged { .. }), "{error}");

    // The damaged entry might name the blob, so removing the other name keeps it.
    let removed = registry.remove("first").unwrap();
    assert!(!removed.blob_removed);
    assert!(first.path.exists());
}

#[test]
fn uploads_are_stored_under_their_digest_or_refused() {
    let dir = tempfile::tempdir().unwrap();
    let registry = Registry::open(dir.path().join("models"));
    let gguf = tiny_gguf(&dir.path().join("m.gguf"), "m");
    let bytes = fs::read(&gguf).unwrap();
    let sha = file_sha256(&gguf).unwrap();

    let mut wrong = registry.blob_writer().unwrap();
    wrong.write_all(&bytes).unwrap();
    let error = wrong
        .finish(Some(&format!("sha256:{}", "0".repeat(64))))
        .unwrap_err();
    assert!(
        matches!(error, ModelError::DigestMismatch { .. }),
        "{error}"
    );
    assert!(!registry.has_blob(&sha).unwrap());

    let mut right = registry.blob_writer().unwrap();
    right.write_all(&bytes).unwrap();
    assert_eq!(right.finish(Some(&format!("sha256:{sha}"))).unwrap(), sha);
    assert!(registry.has_blob(&sha).unwrap());
    let from_blob = Modelfile::parse(&format!("FROM sha256:{sha}\nSYSTEM hi")).unwrap();
    let created = registry.create("uploaded", &from_blob, dir.path()).unwrap();
    assert_eq!(created.sha256, sha);
    // Nothing is left behind in the store but the blob and its stamp.
    let left: Vec<String> = fs::read_dir(registry.root().join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}
