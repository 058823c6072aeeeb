//! What the model commands print.

use std::path::Path;

use cortex_models::{GgufInfo, ModelDetails, ModelEntry, Origin, Removed, parameter_size};
use serde_json::json;

use super::{print_json, timestamp};

fn origin(entry: &ModelEntry) -> String {
    match &entry.origin {
        Origin::Registered { from } => from.clone(),
        Origin::Discovered { dir } => format!("found in {}", dir.display()),
        Origin::File => "a file".to_owned(),
        Origin::Known => "known, fetched on first use".to_owned(),
    }
}

/// Every model in the registry (`cortex models list`).
pub(crate) fn model_list(root: &Path, models: &[ModelEntry], json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(&models);
    }
    if models.is_empty() {
        outln!(
            "no models in {} (fetch the default one with `cortex models pull`)",
            root.display()
        )?;
        return Ok(());
    }
    let width = models
        .iter()
        .map(|m| m.name.to_string().len())
        .max()
        .unwrap_or(4)
        .max(4);
    outln!(
        "{:<width$}  {:<12}  {:>9}  {:<19}  FROM",
        "NAME",
        "ID",
        "SIZE",
        "MODIFIED"
    )?;
    for m in models {
        outln!(
            "{:<width$}  {:<12}  {:>6.1} MB  {:<19}  {}",
            m.name.to_string(),
            &m.sha256[..12],
            m.size as f64 / 1e6,
            timestamp(m.modified_at_ms as i64),
            origin(m)
        )?;
    }
    Ok(())
}

/// A model that was pulled, added or copied.
pub(crate) fn model_entry(entry: &ModelEntry, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(entry);
    }
    outln!(
        "{} (sha256 {}…, {:.1} MB): {}",
        entry.name,
        &entry.sha256[..12],
        entry.size as f64 / 1e6,
        entry.path.display()
    )?;
    Ok(())
}

/// A pulled model: its file's path on stdout (for scripts), what it is on stderr.
pub(crate) fn model_pulled(entry: &ModelEntry, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(entry);
    }
    eprintln!(
        "{} (sha256 {}…, {:.1} MB)",
        entry.name,
        &entry.sha256[..12],
        entry.size as f64 / 1e6
    );
    outln!("{}", entry.path.display())?;
    Ok(())
}

/// A removed name.
pub(crate) fn model_removed(removed: &Removed, json: bool) -> anyhow::Result<()> {
    if json {
        return print_json(removed);
    }
    if removed.blob_removed {
        outln!("removed {} and its model file", removed.name)?;
    } else {
        outln!(
            "removed {} (its model file stays: another name uses it, or a damaged entry might)",
            removed.name
        )?;
    }
    Ok(())
}

/// Which template renders the model's chats, and whose it is: the name's
/// (a Modelfile's TEMPLATE, or cortex's choice for a known model whose
/// GGUF has none) wins over the file's.
fn chat_template_source(in_file: bool, entry: &ModelEntry) -> String {
    match (&entry.settings.template, in_file) {
        (Some(name), false) if !name.contains(['{', '\n']) => {
            format!("{name} (given by cortex: the file has none)")
        }
        (Some(_), _) => "the model's settings (a Modelfile's TEMPLATE)".to_owned(),
        (None, true) => "the file's own".to_owned(),
        (None, false) => "none (chats fail; give one with --chat-template)".to_owned(),
    }
}

/// What the registry and the GGUF say about a model (`cortex models info`).
pub(crate) fn model_facts(entry: &ModelEntry, info: &GgufInfo, json: bool) -> anyhow::Result<()> {
    let details = ModelDetails::of(info);
    let facts = json!({
        "name": entry.name,
        "path": entry.path,
        "sha256": entry.sha256,
        "from": origin(entry),
        "family": details.family,
        "model_name": details.model_name,
        "parameters": details.parameter_count,
        "parameter_size": parameter_size(details.parameter_count),
        "quantization": details.quantization,
        "context_length": details.context_length,
        "embedding_length": details.embedding_length,
        "chat_template": chat_template_source(details.chat_template.is_some(), entry),
        "file_bytes": details.file_size,
        "gguf_version": details.gguf_version,
        "tensors": details.tensors,
        "system": entry.settings.system,
        "parameters_set": entry.settings.parameters,
    });
    if json {
        return print_json(&facts);
    }
    for (key, value) in facts.as_object().into_iter().flatten() {
        if value.is_null() || value.as_array().is_some_and(Vec::is_empty) {
            continue;
        }
        let shown = value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        outln!("{key:<17} {shown}")?;
    }
    Ok(())
}
