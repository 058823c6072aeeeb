//! Which model a worker runs and what identifies it: a name for people and
//! the GGUF's SHA-256 for binding jobs to it (a path says nothing: the same
//! file may sit in many places, and a path may change its contents).

use std::path::PathBuf;

use cortex_models::{ModelEntry, ModelSettings, ParameterValue, Registry, RegistryError};
use cortex_queue::{Job, JobDefaults, JobFilter, JobStore, QueueError};
use cortex_request::ChatTemplateChoice;

use crate::WorkerError;

/// A model, resolved: where its file is and who it is.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelIdentity {
    /// The GGUF file.
    pub path: PathBuf,
    /// Its name in outputs and listings (`name:tag`).
    pub name: String,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
    /// Its system prompt, template and default parameters.
    pub settings: ModelSettings,
}

impl From<ModelEntry> for ModelIdentity {
    fn from(entry: ModelEntry) -> Self {
        Self {
            path: entry.path,
            name: entry.name.to_string(),
            sha256: entry.sha256,
            settings: entry.settings,
        }
    }
}

impl ModelIdentity {
    /// The template its chats render with: with one chosen for every
    /// model (`chosen`, the configured one), the engine's, which renders
    /// with it; else its registry entry's, else its file's own. An engine
    /// serves every name of its weights, so a request says which.
    pub fn chat_template(&self, chosen: Option<&str>) -> ChatTemplateChoice {
        if chosen.is_some() {
            return ChatTemplateChoice::Engine;
        }
        ChatTemplateChoice::of_model(self.settings.template.as_deref())
    }

    /// Why it cannot render a chat, if it cannot: no template chosen for it
    /// (`chosen`, the configured one), none in its registry entry, none in
    /// its GGUF. A known model not fetched yet is taken to chat (every one
    /// does once pulled).
    pub fn chat_refusal(&self, chosen: Option<&str>) -> Option<String> {
        if chosen.is_some() || self.settings.template.is_some() || !self.path.is_file() {
            return None;
        }
        match cortex_models::read_gguf(&self.path) {
            Ok(info) if info.has_chat_template() => None,
            // An unreadable file is the engine's to report, at load.
            Err(_) => None,
            Ok(_) => Some(format!(
                "the model {} has no chat template of its own: choose one with --chat-template (e.g. chatml, gemma, llama3, or a Jinja file), or send prompt lines",
                self.name
            )),
        }
    }
}

fn model_error(setting: &str) -> impl FnOnce(RegistryError) -> WorkerError + '_ {
    move |error| WorkerError::Model {
        model: setting.to_owned(),
        detail: error.to_string(),
    }
}

/// The model `setting` names (`default`, a name, a GGUF path), without
/// fetching a known model (its hash is known) — what a submit records.
pub fn identify(setting: &str, registry: &Registry) -> Result<ModelIdentity, WorkerError> {
    registry
        .identify(setting)
        .map(ModelIdentity::from)
        .map_err(model_error(setting))
}

/// The model `setting` names, fetched and verified if it is a known one not
/// fetched yet, else checked to be a readable GGUF.
pub fn resolve(setting: &str, registry: &Registry) -> Result<ModelIdentity, WorkerError> {
    registry
        .resolve(setting)
        .map(ModelIdentity::from)
        .map_err(model_error(setting))
}

/// The jobs that still need the model with this SHA-256 (not yet completed,
/// failed or cancelled): a model they need is not removed without force.
pub fn jobs_needing(store: &mut dyn JobStore, sha256: &str) -> Result<Vec<Job>, QueueError> {
    let jobs = store.jobs(&JobFilter::default())?;
    Ok(jobs
        .into_iter()
        .filter(|job| !job.state.is_terminal() && job.model_sha256.as_deref() == Some(sha256))
        .collect())
}

/// A registered model's settings as the defaults of the requests it
/// serves: its `SYSTEM` for chats without one, its `PARAMETER`s for what a
/// request leaves unset. (`num_ctx` is not a request's: the engine sizes
/// each sequence's context from its prompt and `max_tokens`.)
pub fn model_defaults(settings: &ModelSettings) -> JobDefaults {
    let mut defaults = JobDefaults {
        system: settings.system.clone(),
        ..JobDefaults::default()
    };
    let (sampling, stop) = (&mut defaults.sampling, &mut defaults.stop);
    for parameter in &settings.parameters {
        let number = parameter.as_f64().unwrap_or_default();
        let float = number as f32;
        let count = number.clamp(0.0, f64::from(u32::MAX)) as u32;
        match parameter.name.as_str() {
            "temperature" => sampling.temperature = float,
            "top_p" => sampling.top_p = float,
            "min_p" => sampling.min_p = float,
            "top_k" => sampling.top_k = number.clamp(0.0, f64::from(i32::MAX)) as i32,
            "repeat_penalty" => sampling.repetition_penalty = float,
            "presence_penalty" => sampling.presence_penalty = float,
            "frequency_penalty" => sampling.frequency_penalty = float,
            "repeat_last_n" => sampling.penalty_last_n = count,
            "seed" => sampling.seed = Some(number.max(0.0) as u64),
            "num_predict" if number > 0.0 => stop.max_tokens = count,
            "stop" => {
                if let ParameterValue::Text(text) = &parameter.value {
                    stop.stop.push(text.clone());
                }
            }
            _ => {}
        }
    }
    defaults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_settings_become_request_defaults() {
        let file = cortex_models::Modelfile::parse(
            "FROM x\nSYSTEM Be brief.\nPARAMETER temperature 0.25\nPARAMETER num_predict 7\nPARAMETER stop END\nPARAMETER top_k 3",
        )
        .unwrap();
        let defaults = model_defaults(&file.settings);
        assert_eq!(defaults.system.as_deref(), Some("Be brief."));
        assert_eq!(defaults.sampling.temperature, 0.25);
        assert_eq!(defaults.sampling.top_k, 3);
        assert_eq!(defaults.stop.max_tokens, 7);
        assert_eq!(defaults.stop.stop, ["END"]);
        assert_eq!(
            model_defaults(&ModelSettings::default()),
            JobDefaults::default()
        );
    }

    #[test]
    fn known_models_are_identified_without_fetching() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path());
        let model = identify("default", &registry).unwrap();
        assert_eq!(model.name, "smollm2-135m:latest");
        assert_eq!(model.sha256, cortex_models::DEFAULT_MODEL.sha256);
        let model = identify("gemma3-270m", &registry).unwrap();
        assert_eq!(model.name, "gemma3-270m:latest");
        assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    }

    #[test]
    fn a_path_that_is_not_a_gguf_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let registry = Registry::open(dir.path().join("cache"));
        let file = dir.path().join("notes.gguf");
        std::fs::write(&file, "hello").unwrap();
        let error = identify(file.to_str().unwrap(), &registry)
            .unwrap_err()
            .to_string();
        assert!(
            error.starts_with(&format!("{}: not a GGUF", file.display())),
            "{error}"
        );
    }
}
