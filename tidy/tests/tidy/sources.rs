//! The sources: where the settings table, `unsafe`, native code, OpenAI's
//! JSON shapes and the dashboard's assets may live, and every module's
//! opening comment.

use super::*;

/// A setting is declared in the table (`cortex-cli/src/settings/`) and read
/// in `config.rs`, which hands each command what it needs (a model, a plan,
/// a library's configuration): adding a setting touches the table and the
/// place it acts, nothing else. `Config` keeps the typed table private (no
/// `Deref` to it), and no other file of the CLI names it.
#[test]
fn only_the_cli_config_reads_the_settings_table() {
    let src = workspace_root().join("cortex-cli/src");
    let config = std::fs::read_to_string(src.join("config.rs")).unwrap();
    assert!(
        !config.contains("impl Deref for Config") && !config.contains("pub(crate) settings:"),
        "cortex-cli/src/config.rs hands out the settings table: keep it private to config.rs"
    );
    let mut files = Vec::new();
    rust_sources(&src, &mut files);
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("config.rs") && !f.starts_with(src.join("settings")))
        .filter(|f| {
            std::fs::read_to_string(f).unwrap().lines().any(|line| {
                !line.trim_start().starts_with("//")
                    && line
                        .split(|c: char| !c.is_alphanumeric() && c != '_')
                        .any(|word| word == "Settings")
            })
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "the settings table is read outside config.rs:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn every_module_says_what_it_is_for() {
    let metadata = metadata();
    let mut files = Vec::new();
    for package in packages(&metadata) {
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        let src = manifest.parent().unwrap().join("src");
        if src.is_dir() {
            rust_sources(&src, &mut files);
        }
    }
    assert!(files.len() > 20, "found only {} source files", files.len());
    let missing: Vec<String> = files
        .iter()
        .filter(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            !text
                .lines()
                .find(|line| !line.trim().is_empty())
                .is_some_and(|line| line.starts_with("//!"))
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "these modules lack a `//!` header saying what they are for:\n{}",
        missing.join("\n")
    );
}

#[test]
fn unsafe_code_lives_only_in_the_bindings_ffi_module() {
    let mut files = Vec::new();
    rust_sources(&workspace_root(), &mut files);
    // Spelled in pieces so that this file does not match itself.
    let needles: Vec<String> = [" {", " fn", " impl"]
        .iter()
        .map(|rest| ["unsafe", rest].concat())
        .collect();
    let has_unsafe = |path: &Path| {
        let text = std::fs::read_to_string(path).unwrap();
        text.lines().any(|line| {
            let code = line.split("//").next().unwrap_or("");
            needles.iter().any(|needle| code.contains(needle.as_str()))
        })
    };
    let ffi = workspace_root().join("cortex-llama/src/sys");
    assert!(
        has_unsafe(&ffi.join("context.rs")),
        "the FFI module is where the rule looks for unsafe code"
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "target"))
        .filter(|f| !f.starts_with(&ffi))
        .filter(|f| has_unsafe(f))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "unsafe code outside cortex-llama/src/sys/:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn native_code_lives_only_in_the_bindings_kernels() {
    // C and C++ sources are cortex's CPU kernels, built by cortex-llama's
    // build.rs and reached only through its FFI module; nowhere else.
    let root = workspace_root();
    let native = root.join("cortex-llama/native");
    let mut files = Vec::new();
    all_files(&root, &mut files);
    let is_native = |f: &PathBuf| {
        f.extension().is_some_and(|e| {
            ["c", "h", "cc", "cpp", "hpp", "cu"].contains(&e.to_string_lossy().as_ref())
        })
    };
    assert!(
        files.iter().any(|f| is_native(f) && f.starts_with(&native)),
        "the kernels are where the rule looks for native code"
    );
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| is_native(f) && !f.starts_with(&native))
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "native sources outside cortex-llama/native/:\n{}",
        offenders.join("\n")
    );
    // The kernels' functions are declared to Rust in the FFI module alone
    // (names spelled in pieces so that this file does not match itself).
    let symbols: Vec<String> = [
        "register",
        "set_threadpool",
        "place_weights",
        "self_check",
        "detect_isa",
    ]
    .iter()
    .map(|name| ["cortex_", "kernels_", name].concat())
    .collect();
    let mut rust = Vec::new();
    rust_sources(&root, &mut rust);
    let declaring: Vec<String> = rust
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "target"))
        .filter(|f| !f.ends_with("cortex-llama/src/sys/kernels.rs"))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            symbols.iter().any(|symbol| text.contains(symbol.as_str()))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        declaring.is_empty(),
        "the kernels' C functions named outside cortex-llama/src/sys/kernels.rs:\n{}",
        declaring.join("\n")
    );
}

#[test]
fn openai_json_shapes_live_only_in_the_wire_format_crate() {
    // The names of OpenAI's response objects, spelled in pieces so that this
    // file does not match itself.
    let needles: Vec<String> = [
        ("chat", ".completion"),
        ("text", "_completion"),
        ("batch", "_req_"),
        ("\"obj", "ect\""),
    ]
    .iter()
    .map(|(a, b)| [*a, *b].concat())
    .collect();
    let mut files = Vec::new();
    for krate in [
        "cortex-models",
        "cortex-queue",
        "cortex-queue-sqlite",
        "cortex-queue-postgres",
        "cortex-worker",
        "cortex-engine",
        "cortex-llama",
        "cortex-cli",
        "cortex-request",
        "cortex-server",
    ] {
        rust_sources(&workspace_root().join(krate).join("src"), &mut files);
    }
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            // Doc comments may show an input line; code may not render one.
            text.lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .any(|line| needles.iter().any(|n| line.contains(n.as_str())))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "OpenAI response shapes outside cortex-openai:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_queue_drivers_write_no_rule_of_their_own() {
    // Texts of the rules every driver follows (the death charge, the job
    // moves a user asks for), spelled in pieces so this file does not match
    // itself: a driver that spells one has copied a rule `cortex-queue`
    // writes once, and the two would drift.
    let needles: Vec<String> = [
        ("not counted as ", "an attempt"),
        ("with this item alone ", "in it"),
        ("'worker", "_lost'"),
        ("nothing to ", "cancel"),
        ("nothing to ", "resume"),
        ("use retry to run its ", "failed items"),
    ]
    .iter()
    .map(|(a, b)| [*a, *b].concat())
    .collect();
    let mut files = Vec::new();
    for krate in ["cortex-queue-sqlite", "cortex-queue-postgres"] {
        rust_sources(&workspace_root().join(krate).join("src"), &mut files);
    }
    let offenders: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let found: Vec<&str> = needles
                .iter()
                .filter(|n| text.contains(n.as_str()))
                .map(String::as_str)
                .collect();
            (!found.is_empty()).then(|| format!("{}: {}", f.display(), found.join(", ")))
        })
        .collect();
    assert!(
        offenders.is_empty(),
        "a queue driver spells a rule cortex-queue writes once:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_dashboard_loads_nothing_from_elsewhere() {
    // The machines cortex runs on are often offline, and a page that pulls
    // code from a CDN runs whatever that host serves: every URL the page
    // names is its own server's, and nothing is fetched by absolute URL.
    let dir = workspace_root().join("cortex-server/src/dashboard");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    assert!(names.len() >= 3, "{names:?}");
    // The one absolute URL allowed: SVG's namespace name, which is never fetched.
    let svg_namespace = ["http://www.w3.org", "/2000/svg"].concat();
    let mut offenders = Vec::new();
    for path in names {
        let text = std::fs::read_to_string(&path).unwrap();
        for (number, line) in text.lines().enumerate() {
            let line = line.replace(&svg_namespace, "");
            let remote = [
                "http:",
                "https:",
                "src=\"//",
                "href=\"//",
                "url(//",
                "@import",
            ]
            .iter()
            .any(|needle| line.contains(needle));
            if remote {
                offenders.push(format!(
                    "{}:{}: {}",
                    path.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "the dashboard names another host:\n{}",
        offenders.join("\n")
    );
}
