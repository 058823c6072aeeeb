//! The subcommands, one module per family. What a command prints, as text
//! or as JSON, is in `output`.

use cortex_queue::Queue;

use crate::config::Config;

mod bench;
mod generate;
mod jobs;
mod models;
mod run;
mod worker;

pub(crate) use bench::bench;
pub(crate) use generate::generate;
pub(crate) use jobs::{cancel, list, results, resume, retry, status, submit};
pub(crate) use models::{
    models_add, models_copy, models_info, models_list, models_pull, models_remove,
};
pub(crate) use run::run_file;
pub(crate) use worker::{detach_worker, detached_workers, worker};

pub(crate) use crate::exit::{BadInput, Exit, NoJob, Unfinished, Usage};

fn open_store(config: &Config) -> anyhow::Result<Box<dyn Queue>> {
    Ok(config.queue()?.open()?)
}

/// `cortex config`: the settings in effect and where each came from.
pub(crate) fn show_config(config: &Config, json: bool) -> anyhow::Result<()> {
    crate::output::settings(config, json)
}
