//! The model cache commands: pull, list, info.

use std::path::PathBuf;

use anyhow::Context as _;
use cortex_engine::{DEFAULT_MODEL, KNOWN_MODELS, ModelCache, ModelSpec, read_gguf};

use crate::config::Config;
use crate::output;
use crate::worker::resolve_model;

pub(crate) fn models_pull(name: Option<&str>) -> anyhow::Result<()> {
    let spec = match name {
        None | Some("default") => &DEFAULT_MODEL,
        Some(name) => ModelSpec::by_name(name).with_context(|| {
            let known: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
            format!(
                "no known model is called {name:?} (known: {})",
                known.join(", ")
            )
        })?,
    };
    let cache = ModelCache::default_location();
    eprintln!(
        "fetching {} into {} (if not there yet)…",
        spec.file_name,
        cache.dir().display()
    );
    let path = cache.ensure(spec)?;
    println!("{}", path.display());
    Ok(())
}

pub(crate) fn models_list(json: bool) -> anyhow::Result<()> {
    let cache = ModelCache::default_location();
    let mut models: Vec<(String, u64)> = match std::fs::read_dir(cache.dir()) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "gguf"))
            .map(|e| {
                (
                    e.path().display().to_string(),
                    e.metadata().map_or(0, |m| m.len()),
                )
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    models.sort();
    output::model_files(cache.dir(), &models, json)
}

pub(crate) fn models_info(config: &Config, model: Option<&str>, json: bool) -> anyhow::Result<()> {
    let path = match model {
        None => resolve_model(config)?.path,
        Some(name) => match (name == "default")
            .then_some(&DEFAULT_MODEL)
            .or_else(|| ModelSpec::by_name(name))
        {
            Some(spec) => ModelCache::default_location().ensure(spec)?,
            None => PathBuf::from(name),
        },
    };
    let info = read_gguf(&path)?;
    output::model_facts(&path, &info, json)
}
