//! What `cortex config` prints: every setting, its value and where it came from.

use serde_json::json;

use super::print_json;
use crate::config::Config;

/// The settings in effect, as `key = value # source` lines or JSON.
pub(crate) fn settings(config: &Config, json: bool) -> anyhow::Result<()> {
    let entries = config.entries();
    if json {
        let map: serde_json::Map<_, _> = entries
            .iter()
            .map(|(k, v, s)| ((*k).to_owned(), json!({ "value": v, "source": s })))
            .collect();
        return print_json(&map);
    }
    match &config.file {
        Some(file) => outln!("# config file: {}", file.display())?,
        None => outln!(
            "# config file: none (looked for ./cortex.toml and $XDG_CONFIG_HOME/cortex/cortex.toml)"
        )?,
    }
    let width = entries.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    for (key, value, source) in entries {
        outln!("{key:<width$} = {value:<50} # {source}")?;
    }
    Ok(())
}
