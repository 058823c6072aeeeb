//! Starting an engine over llama.cpp: the model loaded as the settings
//! place it, one executor (context) per step loop.

use std::sync::Arc;

use cortex_engine::{Engine, EngineConfig, EngineError, Executor, StepObserver};

use crate::chat::resolve_chat_template;
use crate::executor::{ContextConfig, LlamaExecutor};
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
        let mut executors: Vec<Box<dyn Executor + Send + '_>> = Vec::new();
        for _ in 0..each.step_loops {
            let mut executor = LlamaExecutor::new(&model, context, &load.model);
            if let Some(template) = &chat_template {
                executor = executor
                    .with_chat_template(template)
                    .map_err(|e| EngineError::ChatTemplate(e.to_string()))?;
            }
            executors.push(Box::new(executor));
        }
        launch.run(&each, executors);
        Ok(())
    })
}

/// The model, loaded as `config` places it: the backend modules of
/// `backends_dir`, then its layers on `device` (`gpu_layers` of them), the
/// CPU's multiplied by `cpu_kernels`.
pub(crate) fn load_model(config: &EngineConfig) -> Result<Model, EngineError> {
    let backends =
        crate::devices::load_backends(config.backends_dir.as_deref(), config.cpu_kernels);
    if let Some(ceiling) = crate::devices::kernels_ceiling(config.cpu_kernels)
        && let Some(isa) = backends
            .cortex_kernels
            .and_then(crate::sys::kernels::KernelIsa::named)
            .filter(|isa| *isa > ceiling)
    {
        return Err(EngineError::Load {
            path: config.model.clone(),
            detail: format!(
                "--cpu-kernels {}: this process already runs cortex's kernels with {} \
                 (the first model a process loads decides)",
                config.cpu_kernels,
                isa.name()
            ),
        });
    }
    Model::load_on(
        &config.model,
        &config.device,
        config.gpu_layers,
        config.cpu_kernels,
        config.mmap,
    )
}
