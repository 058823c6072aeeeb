//! Two jobs:
//!
//! 1. Builds cortex's CPU kernels (`native/`: a ggml backend in C, see
//!    `src/sys/kernels.rs`) against the headers of the llama.cpp that
//!    llama-cpp-sys-2 built, optimised in every profile (a debug build of a
//!    matrix kernel would misstate every test's and benchmark's speed).
//! 2. Puts llama.cpp beside every program the build makes: its shared
//!    libraries (under the names they are loaded by: `libllama.so.0`, ...)
//!    and the CPU backend's modules (`libggml-cpu-*.so`), in
//!    `target/<profile>/` and in `target/<profile>/deps/` (where tests and
//!    benchmarks run from). Programs find the libraries there through their
//!    `$ORIGIN` run path and the modules beside themselves (see
//!    `src/devices.rs`), so the directory is whole: copy it anywhere and it
//!    runs. (llama-cpp-sys-2 links only the unversioned names, which point at
//!    files it does not copy.)

use std::path::{Path, PathBuf};

fn main() {
    build_kernels();
    place_llama_libraries();
}

/// Compiles `native/*.c` into a static library linked into cortex-llama.
fn build_kernels() {
    // Every file of native/ (a new one is picked up without a list here),
    // in a fixed order.
    println!("cargo:rerun-if-changed=native");
    let mut files: Vec<PathBuf> = std::fs::read_dir("native")
        .expect("cortex-llama/native")
        .flatten()
        .map(|entry| entry.path())
        .collect();
    files.sort();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
    }
    let sources = files
        .iter()
        .filter(|path| path.extension().is_some_and(|e| e == "c"));
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");
    let cmake_dir = PathBuf::from(
        std::env::var("DEP_LLAMA_GGML_CMAKE_DIR")
            .expect("llama-cpp-sys-2 names its ggml (DEP_LLAMA_GGML_CMAKE_DIR)"),
    );
    // <out>/lib/cmake: the installed headers are in <out>/include, and the
    // backend interface (ggml-backend-impl.h, not installed) in the source
    // tree the CMake cache of <out>/build names.
    let out = cmake_dir
        .ancestors()
        .nth(2)
        .expect("DEP_LLAMA_GGML_CMAKE_DIR is <out>/lib/cmake");
    let ggml_source = ggml_source_dir(&out.join("build/CMakeCache.txt"));
    cc::Build::new()
        .files(sources)
        .include(out.join("include"))
        .include(ggml_source.join("src"))
        .std("gnu11")
        // Optimised whatever the profile; the vector code picks its
        // instruction set per function at run time (target attributes), so
        // no -march: the library runs on any x86-64.
        .opt_level(3)
        .debug(false)
        // The kernels and their scalar reference must round alike.
        .flag("-ffp-contract=off")
        .flag_if_supported("-fno-math-errno")
        .warnings(true)
        .extra_warnings(true)
        // A prototype missing from a header, or any warning, stops the build.
        .flag_if_supported("-Wmissing-prototypes")
        .warnings_into_errors(true)
        .compile("cortex_kernels");
}

/// ggml's source directory, as the CMake build that llama-cpp-sys-2 ran
/// recorded it.
fn ggml_source_dir(cache: &Path) -> PathBuf {
    println!("cargo:rerun-if-changed={}", cache.display());
    let text = std::fs::read_to_string(cache).unwrap_or_else(|e| {
        panic!(
            "cannot read llama.cpp's CMake cache {}: {e}",
            cache.display()
        )
    });
    text.lines()
        .find_map(|line| line.strip_prefix("ggml_SOURCE_DIR:STATIC="))
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{} names no ggml_SOURCE_DIR", cache.display()))
}

fn place_llama_libraries() {
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_BACKENDS_DIR");
    let Ok(backends) = std::env::var("DEP_LLAMA_BACKENDS_DIR") else {
        return;
    };
    let backends = PathBuf::from(backends);
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is target/<profile>/build/cortex-llama-<hash>/out.
    let Some(profile_dir) = out.ancestors().nth(3) else {
        return;
    };
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for lib in ["lib", "lib64"] {
        let dir = backends.parent().map(|p| p.join(lib));
        files.extend(dir.iter().flat_map(|d| soname_links(d)));
    }
    files.extend(modules(&backends));
    for dir in [profile_dir.to_owned(), profile_dir.join("deps")] {
        if std::fs::create_dir_all(&dir).is_err() {
            continue;
        }
        for (name, source) in &files {
            place(source, &dir.join(name));
        }
    }
    for (_, source) in &files {
        println!("cargo:rerun-if-changed={}", source.display());
    }
}

/// The shared libraries of `dir` by the names programs load them by: each
/// `libX.so.N` link, with the file it points at.
fn soname_links(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let (_, version) = name.split_once(".so.")?;
            let is_link = entry.file_type().ok()?.is_symlink();
            (is_link && !version.contains('.'))
                .then(|| Some((name, std::fs::canonicalize(entry.path()).ok()?)))?
        })
        .collect()
}

/// The backend modules in `dir`.
fn modules(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .map(|entry| {
            (
                entry.file_name().to_string_lossy().into_owned(),
                entry.path(),
            )
        })
        .filter(|(name, _)| name.starts_with("libggml-") && name.ends_with(".so"))
        .collect()
}

/// Makes `target` the same file as `source`: a hard link where it can be,
/// else a copy.
fn place(source: &Path, target: &Path) {
    let _ = std::fs::remove_file(target);
    if std::fs::hard_link(source, target).is_err() {
        let _ = std::fs::copy(source, target);
    }
}
