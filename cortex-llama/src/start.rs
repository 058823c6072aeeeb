//! Starting an engine over llama.cpp: the model loaded as the settings
//! place it, one backend (context) per step loop.

use std::sync::Arc;

use cortex_engine::{Backend, Engine, EngineConfig, EngineError, StepObserver};

use crate::backend::{ContextConfig, LlamaEngineBackend};
use crate::chat::resolve_chat_template;
use crate::model::Model;

/// Loads the model with llama.cpp as `config` places it and starts the
/// engine's loops. Returns once the model is loaded, or with the reason it
/// could not be.
pub fn start(config: &EngineConfig) -> Result<Engine, EngineError> {
    start_observed(config, None)
}

/// [`start`], with `observer` told of every step and prompt (a trace of
/// where a job's time goes).
pub fn start_observed(
    config: &EngineConfig,
    observer: Option<Box<dyn StepObserver>>,
) -> Result<Engine, EngineError> {
    config.check_limits()?;
    let chat_template = config
        .chat_template
        .as_deref()
        .map(resolve_chat_template)
        .transpose()?;
    let load = config.clone();
    Engine::launch(observer, move |launch| {
        let model = load_model(&load)?;
        launch.place(Arc::new(model.placement()));
        let each = load.for_device(model.computed_on()).per_loop();
        let context = ContextConfig {
            max_batch_tokens: each.decode_tokens(),
            micro_batch_tokens: each.micro_batch_tokens(),
            threads: each.effective_threads(),
            sample_on_device: load.sample_on_device,
        };
        let mut backends: Vec<Box<dyn Backend + Send + '_>> = Vec::new();
        for _ in 0..each.step_loops {
            let mut backend = LlamaEngineBackend::new(&model, context, &load.model);
            if let Some(template) = &chat_template {
                backend = backend
                    .with_chat_template(template)
                    .map_err(|e| EngineError::Model(e.to_string()))?;
            }
            backends.push(Box::new(backend));
        }
        launch.run(&each, backends);
        Ok(())
    })
}

/// The model, loaded as `config` places it: the backend modules of
/// `backends_dir`, then its layers on `device` (`gpu_layers` of them), the
/// CPU's multiplied by `cpu_kernels`.
pub(crate) fn load_model(config: &EngineConfig) -> Result<Model, EngineError> {
    crate::devices::load_backends(config.backends_dir.as_deref());
    Model::load_on(
        &config.model,
        &config.device,
        config.gpu_layers,
        config.cpu_kernels,
    )
}
