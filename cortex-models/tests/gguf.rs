//! GGUF checks on the real default model and on damaged copies of it.

use std::fs;
use std::io::Write;

use cortex_models::{BlobStore, DEFAULT_MODEL, GgufError, read_gguf};

fn model_path() -> std::path::PathBuf {
    BlobStore::default_location()
        .ensure(&DEFAULT_MODEL)
        .expect("default model")
}

#[test]
fn the_default_model_header_reads_back() {
    let info = read_gguf(&model_path()).unwrap();
    assert_eq!(info.version, 3);
    assert_eq!(info.architecture(), Some("llama"));
    assert_eq!(info.context_length(), Some(8192));
    assert!(info.has_chat_template());
    assert_eq!(info.quantisation(), Some("Q4_1"));
    assert!(
        (130_000_000..140_000_000).contains(&info.parameters),
        "{}",
        info.parameters
    );
    assert!(info.required_size <= info.file_size);
    assert_eq!(info.file_size, DEFAULT_MODEL.size);
}

#[test]
fn damaged_files_are_named_and_explained() {
    let dir = tempfile::tempdir().unwrap();
    let model = fs::read(model_path()).unwrap();

    let truncated = dir.path().join("truncated.gguf");
    fs::write(&truncated, &model[..50_000_000]).unwrap();
    let err = read_gguf(&truncated).unwrap_err();
    assert!(
        matches!(
            err,
            GgufError::Truncated {
                actual: 50_000_000,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("truncated.gguf: truncated: its tensors need"),
        "{err}"
    );

    let header_only = dir.path().join("header.gguf");
    fs::write(&header_only, &model[..1000]).unwrap();
    let err = read_gguf(&header_only).unwrap_err().to_string();
    assert!(
        err.ends_with(
            "header.gguf: not a GGUF model file: the header ends early (file is 1000 bytes)"
        ),
        "{err}"
    );

    let text = dir.path().join("notes.txt");
    fs::File::create(&text)
        .unwrap()
        .write_all(b"hello world")
        .unwrap();
    let err = read_gguf(&text).unwrap_err().to_string();
    assert!(
        err.contains("notes.txt: not a GGUF model file: it starts with [68, 65, 6c, 6c]"),
        "{err}"
    );

    let empty = dir.path().join("empty.gguf");
    fs::write(&empty, b"").unwrap();
    let err = read_gguf(&empty).unwrap_err().to_string();
    assert!(
        err.ends_with("empty.gguf: not a GGUF model file: only 0 bytes long"),
        "{err}"
    );

    let missing = dir.path().join("missing.gguf");
    let err = read_gguf(&missing).unwrap_err().to_string();
    assert!(
        err.contains("missing.gguf: No such file or directory"),
        "{err}"
    );

    let err = read_gguf(dir.path()).unwrap_err().to_string();
    assert!(
        err.ends_with("not a GGUF model file: it is a directory"),
        "{err}"
    );
}
