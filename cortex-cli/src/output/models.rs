//! What the model commands print.

use std::path::Path;

use cortex_engine::GgufInfo;
use serde_json::json;

use super::print_json;

/// The GGUF files in the model cache (`cortex models list`).
pub(crate) fn model_files(
    cache: &Path,
    models: &[(String, u64)],
    json: bool,
) -> anyhow::Result<()> {
    if json {
        let list: Vec<_> = models
            .iter()
            .map(|(path, size)| json!({ "path": path, "bytes": size }))
            .collect();
        return print_json(&list);
    }
    if models.is_empty() {
        println!(
            "no models in {} (fetch the default one with `cortex models pull`)",
            cache.display()
        );
    }
    for (path, size) in models {
        println!("{:>8.1} MB  {path}", *size as f64 / 1e6);
    }
    Ok(())
}

/// What a GGUF says about its model (`cortex models info`).
pub(crate) fn model_facts(path: &Path, info: &GgufInfo, json: bool) -> anyhow::Result<()> {
    let facts = json!({
        "path": path,
        "architecture": info.architecture(),
        "name": info.string("general.name"),
        "parameters": info.parameters,
        "context_length": info.context_length(),
        "chat_template": info.has_chat_template(),
        "quantisation": info.quantisation(),
        "file_bytes": info.file_size,
        "gguf_version": info.version,
        "tensors": info.tensor_count,
    });
    if json {
        return print_json(&facts);
    }
    for (key, value) in facts.as_object().into_iter().flatten() {
        let shown = value
            .as_str()
            .map_or_else(|| value.to_string(), str::to_owned);
        println!("{key:<15} {shown}");
    }
    Ok(())
}
