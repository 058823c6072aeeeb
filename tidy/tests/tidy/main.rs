//! Tidy: the workspace's structural invariants (ARCHITECTURE.md), checked
//! from `cargo metadata` and the sources, in the manner of rust-analyzer's
//! `xtask tidy`. A failure names the crate or file and the rule.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

mod crates;
mod docs;
mod modules;
mod names;
mod sources;

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

/// Where crates copied from elsewhere live, each patched for a reason its
/// `PATCHED.md` gives: their code is upstream's, so the rules skip it.
const VENDORED: &str = "third_party";

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path == workspace_root().join(VENDORED) {
            continue;
        }
        if path.is_dir() {
            rust_sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// Every file under `dir` (outside `target/`), recursively.
fn all_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target"
            || name.to_string_lossy().starts_with('.')
            || path == workspace_root().join(VENDORED)
        {
            continue;
        }
        if path.is_dir() {
            all_files(&path, out);
        } else {
            out.push(path);
        }
    }
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

/// A vendored crate is one `[patch.crates-io]` points at, and says what was
/// changed and why.
#[test]
fn every_vendored_crate_is_a_patch_that_says_why() {
    let root = workspace_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let patches = manifest
        .split_once("[patch.crates-io]")
        .map_or("", |(_, rest)| rest);
    for entry in std::fs::read_dir(root.join(VENDORED)).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        assert!(
            entry.path().join("PATCHED.md").is_file(),
            "{VENDORED}/{name} has no PATCHED.md saying what was changed and why"
        );
        assert!(
            patches.contains(&format!("path = \"{VENDORED}/{name}\"")),
            "{VENDORED}/{name} is not a [patch.crates-io] in Cargo.toml"
        );
    }
}
