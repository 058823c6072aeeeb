//! The model commands: list, info, pull, add, cp, rm over the registry.

use std::io::IsTerminal as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use cortex_models::{ModelSettings, Modelfile, PullProgress, read_gguf};

use super::open_store;
use crate::config::Config;
use crate::output;

/// Prints a fetch's progress on a terminal, a line per tenth otherwise.
fn progress_printer() -> impl FnMut(PullProgress) {
    let terminal = std::io::stderr().is_terminal();
    let mut shown = u64::MAX;
    move |p: PullProgress| {
        let percent = p.completed * 100 / p.total.max(1);
        let step = if terminal { percent } else { percent / 10 * 10 };
        if step != shown {
            shown = step;
            if terminal {
                eprint!("\r{percent:>3}% of {:.1} MB", p.total as f64 / 1e6);
                if p.completed >= p.total {
                    eprintln!();
                }
            } else {
                eprintln!("{percent:>3}% of {:.1} MB", p.total as f64 / 1e6);
            }
        }
    }
}

pub(crate) fn models_pull(config: &Config, name: Option<&str>, json: bool) -> anyhow::Result<()> {
    let registry = config.registry();
    let known = cortex_models::Registry::fetchable(name.unwrap_or("default"))?.name;
    eprintln!(
        "pulling {known} into {} (if not there yet)…",
        registry.root().display()
    );
    let entry = registry.pull_with(known, &mut progress_printer())?;
    output::model_pulled(&entry, json)
}

pub(crate) fn models_list(config: &Config, json: bool) -> anyhow::Result<()> {
    let registry = config.registry();
    let listing = registry.list();
    output::model_list(registry.root(), &listing.models, json)?;
    // What `models pull` can add, for a person (JSON stays the registry's list).
    let pullable: Vec<&str> = cortex_models::KNOWN_MODELS
        .iter()
        .map(|spec| spec.name)
        .filter(|name| !listing.models.iter().any(|m| m.name.name() == *name))
        .collect();
    if !json && !pullable.is_empty() {
        eprintln!(
            "can be pulled: {} (`cortex models pull NAME`, or used by name: fetched on first use)",
            pullable.join(", ")
        );
    }
    for damage in &listing.damaged {
        eprintln!("error: {damage}");
    }
    if !listing.damaged.is_empty() {
        bail!(
            "{} registry entr{} could not be read (above); every model file was kept",
            listing.damaged.len(),
            if listing.damaged.len() == 1 {
                "y"
            } else {
                "ies"
            }
        );
    }
    Ok(())
}

pub(crate) fn models_info(config: &Config, model: Option<&str>, json: bool) -> anyhow::Result<()> {
    let registry = config.registry();
    let setting = model.unwrap_or(config.model_setting().0);
    let entry = registry
        .resolve_with(setting, &mut progress_printer())
        .with_context(|| format!("cannot show {setting}"))?;
    let info = read_gguf(&entry.path)?;
    output::model_facts(&entry, &info, json)
}

/// `cortex models add NAME SOURCE`: SOURCE is a GGUF (copied into the
/// registry) or a Modelfile (`FROM`, `SYSTEM`, `TEMPLATE`, `PARAMETER`).
pub(crate) fn models_add(
    config: &Config,
    name: &str,
    source: &Path,
    json: bool,
) -> anyhow::Result<()> {
    let registry = config.registry();
    let mut magic = [0u8; 4];
    let is_gguf = std::fs::File::open(source)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
        .is_ok()
        && &magic == b"GGUF";
    let entry = if is_gguf {
        registry.add(name, source, ModelSettings::default())?
    } else {
        let text = std::fs::read_to_string(source)
            .with_context(|| format!("cannot read {}", source.display()))?;
        let modelfile = Modelfile::parse(&text).with_context(|| {
            format!(
                "{} is neither a GGUF nor a usable Modelfile",
                source.display()
            )
        })?;
        let base_dir = source.parent().unwrap_or(Path::new("."));
        registry.create(name, &modelfile, base_dir)?
    };
    output::model_entry(&entry, json)
}

pub(crate) fn models_copy(config: &Config, from: &str, to: &str, json: bool) -> anyhow::Result<()> {
    let entry = config.registry().copy(from, to)?;
    output::model_entry(&entry, json)
}

/// `cortex models rm NAME`: refused while a job that is not finished needs
/// the weights that would go (unless `force`).
pub(crate) fn models_remove(
    config: &Config,
    name: &str,
    force: bool,
    json: bool,
) -> anyhow::Result<()> {
    let registry = config.registry();
    let entry = registry.find(name)?.ok_or_else(|| registry.unknown(name))?;
    if !registry.shares_weights(&entry) && !force {
        let mut store = open_store(config)?;
        let jobs = cortex_worker::jobs_needing(store.as_mut(), &entry.sha256)?;
        if !jobs.is_empty() {
            let ids: Vec<String> = jobs
                .iter()
                .map(|j| format!("{} ({})", j.id, j.state.as_str()))
                .collect();
            bail!(
                "{} is needed by job{} {}: let {} finish or cancel {}, or remove it with --force",
                entry.name,
                if jobs.len() == 1 { "" } else { "s" },
                ids.join(", "),
                if jobs.len() == 1 { "it" } else { "them" },
                if jobs.len() == 1 { "it" } else { "them" },
            );
        }
    }
    let removed = registry.remove(&entry.name.to_string())?;
    output::model_removed(&removed, json)
}
