//! The crate graph and the manifests: which crates may depend on what,
//! no cycles, the layers table, features switched on for tests only, each
//! crate root's `unsafe` rule.

use super::*;

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
        // Its tests may run the shared suite (only ever a dev-dependency).
        let cortex_deps: Vec<&str> = deps_of(driver)
            .into_iter()
            .filter(|dep| dep.starts_with("cortex-") && *dep != "cortex-queue-suite")
            .collect();
        assert_eq!(
            cortex_deps,
            ["cortex-queue", "cortex-request"].map(str::to_owned),
            "{driver}: a queue driver builds on the queue's core (and the request types) alone"
        );
    }
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
            if dependency["name"] == "cortex-queue-suite" && !dev && name != "cortex-tests" {
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

/// A crate another project can pick up shows its main use in its root's
/// documentation, as a doctest `cargo test` runs.
#[test]
fn every_library_crate_root_shows_its_use_in_a_doctest() {
    // The harness of the tests and tidy itself are no one's library.
    let not_libraries = ["cortex-tests", "cortex-tidy"];
    let missing: Vec<String> = crate_roots(&metadata())
        .into_iter()
        .filter(|(name, root)| {
            root.ends_with("src/lib.rs") && !not_libraries.contains(&name.as_str())
        })
        .filter(|(_, root)| !std::fs::read_to_string(root).unwrap().contains("//! ```"))
        .map(|(name, _)| name)
        .collect();
    assert!(
        missing.is_empty(),
        "crate roots without a doctest: {missing:?}"
    );
}

/// Examples are run by `cargo test` (`test = true`), so one that stops
/// working fails, not only one that stops building.
#[test]
fn every_example_is_run_by_cargo_test() {
    let metadata = metadata();
    let mut examples = 0;
    let mut unrun = Vec::new();
    for package in packages(&metadata) {
        for target in package["targets"].as_array().unwrap() {
            let is_example = target["kind"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == "example");
            if !is_example {
                continue;
            }
            examples += 1;
            if target["test"] != true {
                unrun.push(format!("{} --example {}", package["name"], target["name"]));
            }
        }
    }
    assert!(
        unrun.is_empty(),
        "examples cargo test does not run (set test = true): {unrun:?}"
    );
    assert!(
        examples >= 5,
        "the reusable crates' examples are gone: {examples}"
    );
}
