//! API keys and the projects they act for, from the three places a key may
//! come from: `api_keys` (`--api-key`, `CORTEX_API_KEYS`: admin keys of the
//! `default` project, the one-user set-up), the config file's
//! `[server.keys]` table, and a keys file (`keys_file`, `--keys-file`,
//! `CORTEX_KEYS_FILE`) so that no key need be on a command line, where
//! `ps` shows it.
//!
//! ```toml
//! [server.keys]
//! "sk-alpha-1" = "alpha"                            # a key of project alpha
//! "sk-ops" = { project = "default", admin = true }  # sees every project
//! ```
//!
//! A keys file holds one key a line: `KEY PROJECT`, or `KEY PROJECT admin`;
//! `#` starts a comment.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use anyhow::Context as _;
use cortex_server::ApiKey;
use serde::Deserialize;

/// A value of the `[server.keys]` table.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum KeyEntry {
    /// `"KEY" = "project"`.
    Project(String),
    /// `"KEY" = { project = "...", admin = true }`.
    Full(FullKeyEntry),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FullKeyEntry {
    project: String,
    #[serde(default)]
    admin: bool,
}

/// The longest project name.
const MAX_PROJECT_NAME: usize = 64;

/// A project's name: letters, digits, `-`, `_` and `.`, at most 64.
fn check_project(name: &str) -> Result<(), String> {
    let fine = !name.is_empty()
        && name.len() <= MAX_PROJECT_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fine {
        Ok(())
    } else {
        Err(format!(
            "project {name:?} is not a project name (1 to {MAX_PROJECT_NAME} letters, digits, '-', '_' or '.')"
        ))
    }
}

/// A key: no spaces or control characters (it travels in a header).
fn check_key(key: &str) -> Result<(), String> {
    if key.is_empty()
        || key
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err("a key must be non-empty, without spaces or control characters".into());
    }
    Ok(())
}

/// The keys of the `[server.keys]` table of `file`.
pub(crate) fn from_table(
    table: BTreeMap<String, KeyEntry>,
    file: &Path,
) -> anyhow::Result<Vec<ApiKey>> {
    table
        .into_iter()
        .enumerate()
        .map(|(n, (key, entry))| {
            let (project, admin) = match entry {
                KeyEntry::Project(project) => (project, false),
                KeyEntry::Full(full) => (full.project, full.admin),
            };
            // Keys are secrets: errors say which entry (its position), never the key.
            check_key(&key)
                .and_then(|()| check_project(&project))
                .map_err(|e| {
                    anyhow::anyhow!("{}: [server.keys], key {}: {e}", file.display(), n + 1)
                })?;
            Ok(ApiKey {
                key,
                project,
                admin,
            })
        })
        .collect()
}

/// The keys of a keys file.
pub(crate) fn from_file(path: &Path) -> anyhow::Result<Vec<ApiKey>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the keys file {}", path.display()))?;
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let at = || format!("{}:{}", path.display(), n + 1);
        let (key, project, admin) = match fields.as_slice() {
            [key, project] => (*key, *project, false),
            [key, project, "admin"] => (*key, *project, true),
            [_, _, other] => anyhow::bail!(
                "{}: the third field is {other:?}; it may only be `admin`",
                at()
            ),
            _ => anyhow::bail!(
                "{}: expected `KEY PROJECT` or `KEY PROJECT admin` ({} fields)",
                at(),
                fields.len()
            ),
        };
        check_key(key)
            .and_then(|()| check_project(project))
            .map_err(|e| anyhow::anyhow!("{}: {e}", at()))?;
        keys.push(ApiKey {
            key: key.to_owned(),
            project: project.to_owned(),
            admin,
        });
    }
    Ok(keys)
}

/// Every key once: the same key twice (in one place or two) is an error,
/// since it could act for only one project.
pub(crate) fn check_distinct(keys: &[ApiKey]) -> anyhow::Result<()> {
    let mut seen = HashSet::new();
    for (n, key) in keys.iter().enumerate() {
        if !seen.insert(key.key.as_str()) {
            anyhow::bail!(
                "API key number {} (of project {}) is given twice; each key acts for one project",
                n + 1,
                key.project
            );
        }
    }
    Ok(())
}

/// How `cortex config` shows keys: how many, for which projects.
pub(crate) struct KeysShown<'a>(pub(crate) &'a [ApiKey]);

impl fmt::Display for KeysShown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys = self.0;
        if keys.is_empty() {
            return f.write_str("(none)");
        }
        let projects: std::collections::BTreeSet<&str> =
            keys.iter().map(|k| k.project.as_str()).collect();
        let admins = keys.iter().filter(|k| k.admin).count();
        write!(
            f,
            "({} key{} for {}; {admins} admin)",
            keys.len(),
            if keys.len() == 1 { "" } else { "s" },
            projects.into_iter().collect::<Vec<_>>().join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_keys_file_names_its_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, "# ops\nsk-a alpha\n\nsk-b beta admin # comment\n").unwrap();
        let keys = from_file(&path).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!((keys[1].project.as_str(), keys[1].admin), ("beta", true));
        std::fs::write(&path, "sk-a alpha\nsk-b be/ta\n").unwrap();
        let error = from_file(&path).unwrap_err().to_string();
        assert!(error.contains("keys:2: project \"be/ta\""), "{error}");
        std::fs::write(&path, "sk-a alpha root\n").unwrap();
        let error = from_file(&path).unwrap_err().to_string();
        assert!(error.contains("keys:1: the third field"), "{error}");
        assert!(check_distinct(&[ApiKey::admin("k"), ApiKey::admin("k")]).is_err());
    }
}
