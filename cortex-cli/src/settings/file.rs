//! The config file's keys: each a setting of the table (`[server]`'s as
//! `server.NAME`), its value read as the text the setting parses.

use std::path::Path;

use super::{DEFS, Def, Group, RawValues, def};

/// A TOML value as the text its setting parses: lists comma-separated.
fn file_text(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(x) => Some(x.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        toml::Value::Array(items) => items
            .iter()
            .map(file_text)
            .collect::<Option<Vec<_>>>()
            .map(|items| items.join(",")),
        toml::Value::Datetime(_) | toml::Value::Table(_) => None,
    }
}

/// The settings a config file sets, by name; `[server.keys]` (a table of
/// keys, read apart) is returned as it is. Unknown keys are an error that
/// names them.
pub(crate) fn read_file(
    table: toml::Table,
    path: &Path,
) -> anyhow::Result<(RawValues, Option<toml::Value>)> {
    let mut values = Vec::new();
    let mut key_table = None;
    let unknown = |key: &str| {
        let known: Vec<String> = DEFS.iter().map(Def::key).collect();
        let guess = cortex_request::closest_name(key, known.iter().map(String::as_str))
            .map_or_else(String::new, |k| format!(": did you mean {k:?}?"));
        anyhow::anyhow!(
            "{}: unknown key {key:?}{guess} (the keys are {}, and the [server.keys] table)",
            path.display(),
            known.join(", ")
        )
    };
    let mut take = |key: String, value: &toml::Value, group_server: bool| -> anyhow::Result<()> {
        let name = key.strip_prefix("server.").unwrap_or(&key);
        let def = def(name)
            .filter(|d| (d.group == Group::Server) == group_server)
            .ok_or_else(|| unknown(&key))?;
        let raw = file_text(value).ok_or_else(|| {
            anyhow::anyhow!(
                "{}: {key} must be a string, a number, a boolean or a list",
                path.display()
            )
        })?;
        values.push((def.name, raw));
        Ok(())
    };
    for (key, value) in table {
        if key == "server" {
            let toml::Value::Table(server) = value else {
                anyhow::bail!("{}: server must be a table ([server])", path.display());
            };
            for (key, value) in server {
                if key == "keys" {
                    key_table = Some(value);
                    continue;
                }
                take(format!("server.{key}"), &value, true)?;
            }
        } else {
            take(key, &value, false)?;
        }
    }
    Ok((values, key_table))
}
