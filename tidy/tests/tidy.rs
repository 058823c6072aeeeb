//! Tidy: the workspace's structural invariants (ARCHITECTURE.md), checked
//! from `cargo metadata` and the sources, in the manner of rust-analyzer's
//! `xtask tidy`. A failure names the crate or file and the rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A dependency and the only crates that may have it.
const CONFINED: &[(&str, &[&str], &str)] = &[
    (
        "rusqlite",
        // The tests read how the SQLite driver stores a job.
        &["cortex-queue-sqlite", "cortex-tests"],
        "a database client only in its queue driver",
    ),
    (
        "postgres",
        &["cortex-queue-postgres"],
        "a database client only in its queue driver",
    ),
    (
        "tokio-postgres",
        &["cortex-queue-postgres"],
        "a database client only in its queue driver",
    ),
    (
        "sqlx",
        &["cortex-queue-postgres"],
        "a database client only in its queue driver",
    ),
    (
        "postgres-native-tls",
        &["cortex-queue-postgres"],
        "a database client (and its TLS) only in its queue driver",
    ),
    (
        "llama-cpp-sys-2",
        &["cortex-llama"],
        "llama.cpp only in the binding",
    ),
    (
        "llama-cpp-2",
        &["cortex-llama"],
        "llama.cpp only in the binding",
    ),
    (
        "libloading",
        &["cortex-llama"],
        "loading native code only in the binding's FFI",
    ),
    (
        "anyhow",
        &["cortex-cli"],
        "anyhow only in the CLI (libraries have typed errors)",
    ),
    (
        "tokio",
        // The object store's client is async: a private runtime drives it.
        &["cortex-server", "cortex-objects"],
        "an async runtime only in the server (and the object store's own)",
    ),
    (
        "object_store",
        &["cortex-objects"],
        "object stores only behind cortex-objects",
    ),
    (
        "reqwest",
        &["cortex-objects"],
        "an async HTTP client only under the object store",
    ),
    (
        "async-std",
        &["cortex-server"],
        "an async runtime only in the server",
    ),
    (
        "axum",
        &["cortex-server"],
        "a web framework only in the server",
    ),
    (
        "hyper",
        &["cortex-server"],
        "a web framework only in the server",
    ),
    (
        "hyper-util",
        &["cortex-server"],
        "a web framework only in the server",
    ),
    (
        "actix-web",
        &["cortex-server"],
        "a web framework only in the server",
    ),
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

fn metadata() -> serde_json::Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("cargo metadata's JSON")
}

fn packages(metadata: &serde_json::Value) -> &Vec<serde_json::Value> {
    metadata["packages"].as_array().expect("packages")
}

#[test]
fn dependencies_stay_in_their_crates() {
    let metadata = metadata();
    let mut problems = Vec::new();
    for package in packages(&metadata) {
        let name = package["name"].as_str().unwrap();
        for dependency in package["dependencies"].as_array().unwrap() {
            let dep = dependency["name"].as_str().unwrap();
            for (confined, allowed, rule) in CONFINED {
                if dep == *confined && !allowed.contains(&name) {
                    problems.push(format!("{name} depends on {dep}: {rule}"));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The workspace's crates and the workspace crates each depends on, every
/// kind of dependency counted (normal, build and dev: cargo allows a cycle
/// through dev-dependencies, and a crate naming itself to switch on a
/// feature for its tests, but either makes the layering untrue).
fn workspace_graph(metadata: &serde_json::Value) -> BTreeMap<String, BTreeSet<String>> {
    dependency_graph(metadata, |_| true)
}

/// The workspace's crates and the workspace crates each depends on through
/// the dependencies `counted` keeps (given each one's `cargo metadata` entry).
fn dependency_graph(
    metadata: &serde_json::Value,
    counted: impl Fn(&serde_json::Value) -> bool,
) -> BTreeMap<String, BTreeSet<String>> {
    let packages = packages(metadata);
    let members: BTreeSet<String> = packages
        .iter()
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect();
    packages
        .iter()
        .map(|p| {
            let deps = p["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| counted(d))
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .filter(|d| members.contains(d))
                .collect();
            (p["name"].as_str().unwrap().to_owned(), deps)
        })
        .collect()
}

/// A cycle in `graph`, as the path that closes it, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = path.iter().position(|n| n == node).unwrap();
                let mut cycle = path[from..].to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_owned(), Mark::Open);
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_owned(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut marks, &mut Vec::new()))
}

#[test]
fn the_cycle_finder_finds_self_loops_and_long_cycles() {
    let graph = |edges: &[(&str, &str)]| {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            graph
                .entry((*from).into())
                .or_default()
                .insert((*to).into());
            graph.entry((*to).into()).or_default();
        }
        graph
    };
    assert_eq!(
        find_cycle(&graph(&[("a", "b"), ("b", "c"), ("a", "c")])),
        None
    );
    assert_eq!(
        find_cycle(&graph(&[("a", "a")])),
        Some(vec!["a".into(), "a".into()])
    );
    assert_eq!(
        find_cycle(&graph(&[("x", "a"), ("a", "b"), ("b", "c"), ("c", "a")])),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn the_crate_graph_has_no_cycles_dev_dependencies_included() {
    let graph = workspace_graph(&metadata());
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "the crate graph has a cycle (dev-dependencies count): {}",
            cycle.join(" -> ")
        );
    }
    // The end-to-end tests sit on top, and tidy beside everything:
    // nothing depends on them.
    for (name, deps) in &graph {
        for top in ["cortex-tests", "cortex-tidy"] {
            assert!(
                !deps.contains(top),
                "{name} depends on {top}, which sits above every crate"
            );
        }
    }
}

#[test]
fn the_engine_sits_below_the_queue_users() {
    let graph = workspace_graph(&metadata());
    let deps_of = |name: &str| -> Vec<&str> {
        graph
            .get(name)
            .map(|deps| deps.iter().map(String::as_str).collect())
            .unwrap_or_default()
    };
    // The policy crates know nothing of the engine, the queue or the worker.
    let policy = [
        "cortex-request",
        "cortex-sample",
        "cortex-kv",
        "cortex-sched",
    ];
    for base in policy {
        for dep in deps_of(base) {
            assert!(
                policy.contains(&dep),
                "{base} depends on {dep}: the policy crates sit below the engine and the queue"
            );
        }
    }
    // The grammar compiler is a leaf: JSON in, GBNF out.
    assert_eq!(deps_of("cortex-grammar"), Vec::<&str>::new());
    // The model registry is plain files: any tool can manage models without
    // building the engine (which builds on it to check GGUFs).
    assert_eq!(
        deps_of("cortex-models"),
        Vec::<&str>::new(),
        "cortex-models is a leaf: no engine, queue or request types"
    );
    // The engine and the queue do not know each other; the worker joins them.
    assert!(!deps_of("cortex-engine").contains(&"cortex-queue"));
    assert!(!deps_of("cortex-queue").contains(&"cortex-engine"));
    assert!(!deps_of("cortex-worker").contains(&"cortex-cli"));
    // The queue's core knows neither its drivers nor the wire format, and
    // its drivers know only the core (no driver builds on another).
    for above in [
        "cortex-queue-sqlite",
        "cortex-queue-postgres",
        "cortex-openai",
    ] {
        assert!(
            !deps_of("cortex-queue").contains(&above),
            "cortex-queue depends on {above}: the queue's core sits below its drivers and the wire format"
        );
    }
    for driver in ["cortex-queue-sqlite", "cortex-queue-postgres"] {
        let cortex_deps: Vec<&str> = deps_of(driver)
            .into_iter()
            .filter(|dep| dep.starts_with("cortex-"))
            .collect();
        assert_eq!(
            cortex_deps,
            ["cortex-queue", "cortex-request"].map(str::to_owned),
            "{driver}: a queue driver builds on the queue's core (and the request types) alone"
        );
    }
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

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

/// "Backend" names llama.cpp's device modules (and cortex's own CPU
/// backend among them), nothing else: the engine's trait for what runs a
/// model is the `Executor`, queue storage a driver (ARCHITECTURE.md's
/// glossary). Outside the binding, which loads those modules, nothing
/// defined is named with the word but where the modules are looked for.
#[test]
fn backend_names_only_llama_cpps_modules() {
    let root = workspace_root();
    let mut files = Vec::new();
    for member in std::fs::read_dir(&root).unwrap() {
        let src = member.unwrap().path().join("src");
        if src.is_dir() && !src.starts_with(root.join("cortex-llama")) {
            rust_sources(&src, &mut files);
        }
    }
    let defines = [
        "trait", "struct", "enum", "type", "fn", "mod", "const", "static",
    ];
    let mut offenders = Vec::new();
    for file in &files {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        let words: Vec<&str> = code
            .split(|c: char| !c.is_alphanumeric() && c != '_')
            .filter(|word| !word.is_empty())
            .collect();
        for pair in words.windows(2) {
            // Where the modules are looked for (`backends_dir`) is about them.
            let name = pair[1].to_lowercase();
            if defines.contains(&pair[0])
                && name.contains("backend")
                && !name.contains("backends_dir")
            {
                offenders.push(format!(
                    "{}: {} {}",
                    file.strip_prefix(&root).unwrap_or(file).display(),
                    pair[0],
                    pair[1]
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "\"backend\" names llama.cpp's modules only (the engine's trait is the Executor, queue storage a driver):\n{}",
        offenders.join("\n")
    );
}

/// The same rule in what tidy's definition check does not read: comments,
/// strings, error codes and manifests, outside the binding. A line may say
/// "backend" only about llama.cpp's modules and devices (it names one of
/// them, or a device field) or PostgreSQL's own (`pg_backend_pid`).
#[test]
fn backend_in_comments_strings_and_manifests_means_llama_cpps_modules() {
    let root = workspace_root();
    let mut files = vec![root.join("Cargo.toml")];
    for member in std::fs::read_dir(&root).unwrap() {
        let member = member.unwrap().path();
        if !member.is_dir() || member.ends_with("cortex-llama") || member.ends_with("target") {
            continue;
        }
        for dir in ["src", "tests", "examples", "benches"] {
            if member.join(dir).is_dir() {
                rust_sources(&member.join(dir), &mut files);
            }
        }
        if member.join("Cargo.toml").is_file() {
            files.push(member.join("Cargo.toml"));
        }
    }
    // What a line says "backend" about when it is llama.cpp's.
    let about_modules = [
        "module",
        "vulkan",
        "cpu",
        "cuda",
        "ggml",
        "llama",
        "device",
        "backends",
        "pg_",
        "backend\"",
        ".backend",
        "backend:",
        "backend ==",
        // The error code's old name, kept readable for error files written before.
        "backend_error",
    ];
    let mut offenders = Vec::new();
    for file in &files {
        // This test names the word in its own rule.
        if file.ends_with("tidy/tests/tidy.rs") {
            continue;
        }
        for (number, line) in std::fs::read_to_string(file).unwrap().lines().enumerate() {
            let lower = line.to_lowercase();
            if lower.contains("backend") && !about_modules.iter().any(|word| lower.contains(word)) {
                offenders.push(format!(
                    "{}:{}: {}",
                    file.strip_prefix(&root).unwrap_or(file).display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "\"backend\" names llama.cpp's modules only; an engine runs an executor, the queue a driver:\n{}",
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

/// Every file under `dir` (outside `target/`), recursively.
fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            all_files(&path, out);
        } else {
            out.push(path);
        }
    }
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
fn only_the_binding_and_the_programs_compile_llama_cpp() {
    // The engine, the worker and the server use the engine's handle and its
    // `Executor` trait; llama.cpp (and cortex's C kernels) build into the
    // binding and what links a program from it. Normal dependencies only:
    // tests and examples may start a real engine.
    let metadata = metadata();
    let normal = dependency_graph(&metadata, |d| d["kind"].is_null());
    let reaches_binding = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![start.to_owned()];
        while let Some(name) = todo.pop() {
            if name == "cortex-llama" {
                return true;
            }
            if seen.insert(name.clone()) {
                todo.extend(normal.get(&name).into_iter().flatten().cloned());
            }
        }
        false
    };
    let allowed = ["cortex-llama", "cortex-cli", "cortex-tests"];
    let offenders: Vec<&String> = normal
        .keys()
        .filter(|name| !allowed.contains(&name.as_str()) && reaches_binding(name))
        .collect();
    assert!(
        offenders.is_empty(),
        "these crates compile llama.cpp (through cortex-llama): {offenders:?}"
    );
    assert!(
        reaches_binding("cortex-cli"),
        "the rule looks for the binding where the program links it"
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

/// Source text without comment lines and without the unit tests at the end
/// of a file (`#[cfg(test)] mod tests`), which may use anything.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(end) => &text[..end],
        None => text,
    };
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn leading_identifier(text: &str) -> String {
    text.trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The top-level names a `{...}` group (text after its opening brace) names:
/// the first identifier of each element, or the last one when `last`.
fn group_names(after_brace: &str, last: bool) -> Vec<String> {
    let (mut depth, mut names, mut element) = (0usize, Vec::new(), String::new());
    let flush = |element: &mut String, names: &mut Vec<String>| {
        let segment = if last {
            element.rsplit("::").next().unwrap_or("").to_owned()
        } else {
            element.clone()
        };
        let name = leading_identifier(&segment);
        if !name.is_empty() {
            names.push(name);
        }
        element.clear();
    };
    for c in after_brace.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => flush(&mut element, &mut names),
            _ if depth == 0 => element.push(c),
            _ => {}
        }
    }
    flush(&mut element, &mut names);
    names
}

/// Every name a file reaches through `crate::` (the first segment after it).
fn crate_references(code: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        match rest.strip_prefix('{') {
            Some(group) => names.extend(group_names(group, false)),
            None => names.push(leading_identifier(rest)),
        }
    }
    names
}

/// What the crate root re-exports: a name and the top-level module it comes from.
fn reexports(lib: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    for (at, _) in lib.match_indices("use ") {
        let path = &lib[at + "use ".len()..];
        let path = &path[..path.find(';').unwrap_or(path.len())];
        let module = leading_identifier(path);
        if !modules.contains(&module) {
            continue;
        }
        let rest = &path[module.len()..];
        let Some(rest) = rest.strip_prefix("::") else {
            continue;
        };
        let names = match rest.strip_prefix('{') {
            Some(group) => group_names(group, true),
            None => vec![leading_identifier(rest.rsplit("::").next().unwrap_or(""))],
        };
        for name in names {
            found.insert(name, module.clone());
        }
    }
    found
}

/// The node of a crate's root file (`lib.rs` or `main.rs`) in its module graph.
const ROOT: &str = "(crate root)";

/// The names of the items a file defines at its top level (functions,
/// types, constants, statics, macros).
fn defined_items(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in code.lines() {
        let mut words = line.split_whitespace().peekable();
        while let Some(word) = words.next() {
            let keyword = matches!(
                word,
                "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union"
            ) || word == "macro_rules!";
            if keyword && let Some(next) = words.peek() {
                let name = leading_identifier(next);
                if !name.is_empty() {
                    names.insert(name);
                }
                break;
            }
        }
    }
    names
}

/// The top-level modules the root file's own code uses: paths through them,
/// not the `mod` lines that declare them nor the `pub use` lines that only
/// re-export.
fn root_uses(root: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut uses = BTreeSet::new();
    for line in root.lines() {
        let trimmed = line.trim_start();
        let declares = trimmed.starts_with("mod ")
            || trimmed.starts_with("pub mod ")
            || trimmed.starts_with("pub(crate) mod ")
            || trimmed.starts_with("pub use ")
            || trimmed.starts_with("pub(crate) use ");
        if declares {
            continue;
        }
        for (at, _) in line.match_indices("::") {
            let before = &line[..at];
            let name: String = before
                .chars()
                .rev()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            let qualified = before[..before.len() - name.len()].ends_with("::");
            if modules.contains(&name)
                && (!qualified
                    || before.ends_with(&format!("crate::{name}"))
                    || before.ends_with(&format!("self::{name}")))
            {
                uses.insert(name);
            }
        }
    }
    uses
}

/// A crate's top-level modules and its root file, and which of them each
/// one uses (a module uses the root when it names an item the root defines,
/// through `crate::` or, from a top-level module, `super::`).
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files_of: BTreeMap<String, Vec<PathBuf>> = BTreeMap::new();
    let mut files = Vec::new();
    rust_sources(src, &mut files);
    let mut root = String::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            root.push_str(&code_of(&std::fs::read_to_string(&file).unwrap()));
            root.push('\n');
        } else {
            files_of.entry(module).or_default().push(file);
        }
    }
    let modules: BTreeSet<String> = files_of.keys().cloned().collect();
    let reexported = reexports(&root, &modules);
    let root_items = defined_items(&root);
    let mut graph: BTreeMap<String, BTreeSet<String>> = files_of
        .iter()
        .map(|(module, files)| {
            let mut uses = BTreeSet::new();
            for file in files {
                let code = code_of(&std::fs::read_to_string(file).unwrap());
                let depth = file.strip_prefix(src).unwrap().components().count();
                let top_level = depth == 1 || (depth == 2 && file.ends_with("mod.rs"));
                let mut names = crate_references(&code);
                if top_level {
                    names.extend(super_references(&code));
                }
                for name in names {
                    let target = if modules.contains(&name) {
                        Some(name)
                    } else if let Some(module) = reexported.get(&name) {
                        Some(module.clone())
                    } else if root_items.contains(&name) {
                        Some(ROOT.to_owned())
                    } else {
                        None
                    };
                    uses.extend(target.filter(|t| t != module));
                }
            }
            (module.clone(), uses)
        })
        .collect();
    graph.insert(ROOT.to_owned(), root_uses(&root, &modules));
    graph
}

/// Every name a file reaches through `super::` (the first segment after it).
fn super_references(code: &str) -> Vec<String> {
    crate_references(&code.replace("super::", "crate::"))
}

#[test]
fn the_module_reader_follows_groups_and_reexports() {
    let code = code_of(
        "use crate::{a::X, b, c::{d, e}};\n// crate::commented\nfn f() { crate::f::g(); }\n#[cfg(test)]\nmod tests { use crate::h; }",
    );
    assert_eq!(crate_references(&code), ["a", "b", "c", "f"]);
    let modules: BTreeSet<String> = ["m", "n"].map(String::from).into();
    let found = reexports(
        "pub use m::{One, two::Two};\npub use n::Three;\npub use n::inner::Four;",
        &modules,
    );
    assert_eq!(found["One"], "m");
    assert_eq!(found["Two"], "m");
    assert_eq!(found["Three"], "n");
    assert_eq!(found["Four"], "n");
}

#[test]
fn modules_do_not_import_each_other_in_a_circle() {
    let metadata = metadata();
    let mut problems = Vec::new();
    for package in packages(&metadata) {
        let name = package["name"].as_str().unwrap();
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        let src = manifest.parent().unwrap().join("src");
        if !src.join("lib.rs").is_file() && !src.join("main.rs").is_file() {
            continue;
        }
        if let Some(cycle) = find_cycle(&module_graph(&src)) {
            problems.push(format!(
                "{name}: modules import each other in a circle: {}",
                cycle.join(" -> ")
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_module_that_uses_what_its_crate_root_defines_makes_an_edge_to_the_root() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\npub use b::Thing;\npub struct Config;\nfn run() { a::go(); }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("a.rs"),
        "//! A.\nuse crate::Config;\npub fn go() {}\n",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "//! B.\nuse super::Thing;\npub struct Thing;\n",
    )
    .unwrap();
    let graph = module_graph(src);
    assert_eq!(graph[ROOT], BTreeSet::from(["a".to_owned()]));
    assert_eq!(graph["a"], BTreeSet::from([ROOT.to_owned()]));
    assert!(graph["b"].is_empty(), "a re-export is no use of the root");
    assert!(find_cycle(&graph).is_some());
}

/// Each package's root files: `src/lib.rs` and `src/main.rs`, where present.
fn crate_roots(metadata: &serde_json::Value) -> Vec<(String, PathBuf)> {
    let mut roots = Vec::new();
    for package in packages(metadata) {
        let name = package["name"].as_str().unwrap().to_owned();
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        for root in ["src/lib.rs", "src/main.rs"] {
            let path = manifest.parent().unwrap().join(root);
            if path.is_file() {
                roots.push((name.clone(), path));
            }
        }
    }
    roots
}

#[test]
fn every_crate_root_forbids_unsafe_code_but_the_binding() {
    let metadata = metadata();
    let mut problems = Vec::new();
    for (name, root) in crate_roots(&metadata) {
        let text = std::fs::read_to_string(&root).unwrap();
        // The llama.cpp binding denies unsafe code and allows it in `sys`
        // alone.
        let wanted = if name == "cortex-llama" {
            "#![deny(unsafe_code)]"
        } else {
            "#![forbid(unsafe_code)]"
        };
        if !text.lines().any(|line| line.trim() == wanted) {
            problems.push(format!("{}: no {wanted}", root.display()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn only_the_binding_names_llama_cpp_sys() {
    let mut files = Vec::new();
    rust_sources(&workspace_root(), &mut files);
    let binding = workspace_root().join("cortex-llama/src/sys");
    // Spelled in pieces so that this file does not match itself.
    let needle = ["llama", "_cpp_sys_2"].concat();
    let offenders: Vec<String> = files
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "target"))
        .filter(|f| !f.starts_with(&binding))
        .filter(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            text.lines()
                .any(|line| line.split("//").next().unwrap_or("").contains(&needle))
        })
        .map(|f| f.display().to_string())
        .collect();
    assert!(
        offenders.is_empty(),
        "llama.cpp's bindings named outside cortex-llama/src/sys/:\n{}",
        offenders.join("\n")
    );
}

/// Every place a crate other than the tests crate switches on `feature` of
/// a dependency outside its dev-dependencies.
fn switched_on_outside_tests(metadata: &serde_json::Value, feature: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for package in packages(metadata) {
        let name = package["name"].as_str().unwrap();
        for dependency in package["dependencies"].as_array().unwrap() {
            let features = dependency["features"].as_array().unwrap();
            let switched_on = features.iter().any(|f| f.as_str() == Some(feature));
            let dev = dependency["kind"].as_str() == Some("dev");
            if switched_on && !dev && name != "cortex-tests" {
                problems.push(format!(
                    "{name} switches on {}'s {feature} outside its dev-dependencies",
                    dependency["name"].as_str().unwrap()
                ));
            }
        }
    }
    problems
}

#[test]
fn failpoints_are_switched_on_for_tests_only() {
    let metadata = metadata();
    let mut problems = switched_on_outside_tests(&metadata, "failpoints");
    // The tests crate switches them on for the binary it drives: it must not
    // be built by a plain `cargo build` at the root, or they would ship.
    let tests_id = packages(&metadata)
        .iter()
        .find(|p| p["name"] == "cortex-tests")
        .map(|p| p["id"].clone())
        .unwrap();
    let defaults = metadata["workspace_default_members"]
        .as_array()
        .expect("cargo metadata lists the default members");
    if defaults.contains(&tests_id) {
        problems.push(
            "cortex-tests is a default member: `cargo build` would ship the failpoints".into(),
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn a_plain_cargo_test_runs_tidy() {
    // This crate is a default member (its row in the layers table keeps it
    // free of the workspace's crates, so it builds in seconds).
    let metadata = metadata();
    let tidy_id = packages(&metadata)
        .iter()
        .find(|p| p["name"] == "cortex-tidy")
        .map(|p| p["id"].clone())
        .unwrap();
    let defaults = metadata["workspace_default_members"]
        .as_array()
        .expect("cargo metadata lists the default members");
    assert!(
        defaults.contains(&tidy_id),
        "cortex-tidy is not a default member: a plain `cargo test` would skip tidy"
    );
}

#[test]
fn test_support_is_switched_on_for_tests_only() {
    // Test helpers (a fake executor, databases made and dropped) must not
    // reach a program: only a dev-dependency, or the tests crate (never a
    // default member), may ask for them.
    let problems = switched_on_outside_tests(&metadata(), "test-support");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_queue_suite_is_only_a_dev_dependency() {
    // Its cases arm failpoints and spawn the test binary again: they belong
    // in a driver's tests (or the tests crate's), never in a library's build.
    let mut problems = Vec::new();
    for package in packages(&metadata()) {
        let name = package["name"].as_str().unwrap();
        for dependency in package["dependencies"].as_array().unwrap() {
            let dev = dependency["kind"].as_str() == Some("dev");
            if dependency["name"] == "cortex-queue-suite" && !dev {
                problems.push(format!(
                    "{name} depends on cortex-queue-suite outside its dev-dependencies"
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// ARCHITECTURE.md's layers table: each crate and the crates it may depend
/// on, in the table's order (lowest first).
fn layers_table() -> Vec<(String, BTreeSet<String>)> {
    let text = std::fs::read_to_string(workspace_root().join("ARCHITECTURE.md")).unwrap();
    let start = text
        .find("<!-- tidy:layers -->")
        .expect("ARCHITECTURE.md has the layers table");
    let end = text[start..].find("<!-- /tidy:layers -->").unwrap() + start;
    text[start..end]
        .lines()
        .filter(|line| line.starts_with("| cortex-"))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let allowed = cells[3]
                .split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(String::from)
                .collect();
            (cells[1].to_owned(), allowed)
        })
        .collect()
}

#[test]
fn the_layers_table_is_the_crate_graph() {
    let table = layers_table();
    let metadata = metadata();
    let graph = workspace_graph(&metadata);
    let mut problems = Vec::new();
    let mut below: BTreeSet<String> = BTreeSet::new();
    for (name, allowed) in &table {
        for dependency in allowed.difference(&below) {
            problems.push(format!(
                "ARCHITECTURE.md: {name} may depend on {dependency}, which is not in a row above it"
            ));
        }
        below.insert(name.clone());
    }
    let rows: BTreeMap<&String, &BTreeSet<String>> = table.iter().map(|(n, a)| (n, a)).collect();
    for (name, dependencies) in &graph {
        let Some(allowed) = rows.get(name) else {
            problems.push(format!(
                "ARCHITECTURE.md's layers table has no row for {name}"
            ));
            continue;
        };
        for dependency in dependencies.difference(allowed) {
            problems.push(format!(
                "{name} depends on {dependency}, which its row in ARCHITECTURE.md does not allow"
            ));
        }
    }
    for name in rows.keys() {
        if !graph.contains_key(*name) {
            problems.push(format!(
                "ARCHITECTURE.md names {name}, which is not in the workspace"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn test_helpers_are_behind_a_test_support_feature() {
    let mut files = Vec::new();
    rust_sources(&workspace_root(), &mut files);
    let mut problems = Vec::new();
    for file in files
        .iter()
        .filter(|f| !f.components().any(|c| c.as_os_str() == "target"))
        .filter(|f| f.ends_with("lib.rs"))
    {
        let text = std::fs::read_to_string(file).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let helpers = ["pub mod testing;", "pub mod fake;"];
            if helpers.contains(&line.trim())
                && !lines[..i]
                    .iter()
                    .rev()
                    .take_while(|l| {
                        l.trim_start().starts_with("#[") || l.trim_start().starts_with("//")
                    })
                    .any(|l| l.contains("feature = \"test-support\""))
            {
                problems.push(format!(
                    "{}:{}: a test helper module outside the `test-support` feature",
                    file.display(),
                    i + 1
                ));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The anchor a Markdown heading gets (GitHub's and mdBook's rule):
/// lowercase, spaces to `-`, everything but letters, digits, `-` and `_` dropped.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// A Markdown text's lines outside its fenced code blocks.
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// The anchors of a Markdown file's headings.
fn anchors(text: &str) -> BTreeSet<String> {
    prose_lines(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| heading_anchor(line.trim_start_matches('#')))
        .collect()
}

/// The targets of a Markdown text's inline links and images.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose_lines(text) {
        // Inline code spans hold no links.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn the_readme_and_the_book_link_only_to_what_exists() {
    let root = workspace_root();
    let mut documents = vec![root.join("README.md"), root.join("ARCHITECTURE.md")];
    let mut chapters: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    chapters.sort();
    documents.extend(chapters.iter().cloned());
    let mut broken = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        for target in link_targets(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let file = if path.is_empty() {
                document.clone()
            } else {
                document.parent().unwrap().join(path)
            };
            if !file.exists() {
                broken.push(format!("{}: {target}: no such file", document.display()));
            } else if !anchor.is_empty() {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&text).contains(anchor) {
                    broken.push(format!("{}: {target}: no such heading", document.display()));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    // Every chapter is in the book's table of contents.
    let summary = std::fs::read_to_string(root.join("docs/SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = link_targets(&summary).into_iter().collect();
    for chapter in &chapters {
        let name = chapter.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name == "SUMMARY.md" || listed.contains(&name),
            "docs/{name} is not in docs/SUMMARY.md, so the book leaves it out"
        );
    }
    // The README is a landing page; the rest is the book's.
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 200,
        "README.md has {} lines: move detail into the book (docs/)",
        readme.lines().count()
    );
}

#[test]
fn headings_become_the_anchors_links_use() {
    assert_eq!(
        heading_anchor(" Settings and exit codes"),
        "settings-and-exit-codes"
    );
    assert_eq!(
        heading_anchor(" Tools, reasoning and a line's model"),
        "tools-reasoning-and-a-lines-model"
    );
    assert_eq!(link_targets("see [a](b.md#c) and `[x](y)`"), ["b.md#c"]);
}
