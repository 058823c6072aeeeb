//! Each crate's modules: a small reader of `use` paths and re-exports,
//! and no module cycle within a crate.

use super::*;

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
