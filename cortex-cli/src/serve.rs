//! `cortex serve`: settings into a `cortex_server::ServerConfig`, the model
//! resolved and the engine started here, then the server runs until a signal.

use crate::config::Config;

pub(crate) fn serve(config: &Config) -> anyhow::Result<()> {
    let plan = config.serve_plan()?;
    let model = config.resolve_model()?;
    let (listen, tcp) = (plan.listen, plan.tcp);
    // A port already taken fails now, before the model loads and before
    // anything says "serving"; the listener is let go just before the
    // server binds it.
    let port_held = tcp
        .then(|| {
            std::net::TcpListener::bind(listen).map_err(|e| {
                anyhow::anyhow!(
                    "cannot listen on {listen}: {e} (another server there? choose another with --port)"
                )
            })
        })
        .transpose()?;
    if plan.keys.is_empty() && tcp {
        if listen.ip().is_loopback() {
            eprintln!(
                "no API keys: serving this machine only ({listen}); to serve others, listen on their network with --host 0.0.0.0 and give keys (CORTEX_API_KEYS or --keys-file, where ps does not show them)"
            );
        } else {
            eprintln!(
                "warning: no API keys on {listen}: anyone who can reach it can use it (give keys: CORTEX_API_KEYS or --keys-file)"
            );
        }
    }
    let engine = cortex_llama::start(&config.engine_config(&model))?;
    let parallel = engine.info().parallel;
    let mut places: Vec<String> = Vec::new();
    if tcp {
        places.push(format!("http://{listen}"));
    }
    if let Some(path) = &plan.unix_socket {
        places.push(format!("unix socket {} (mode 0600)", path.display()));
    }
    eprintln!(
        "serving {} on {} (OpenAI API under /v1, Ollama API under /api; {parallel} sequences, up to {} for batches), on {}",
        model.name,
        places.join(" and "),
        config.batch_parallel(parallel),
        crate::work::describe_device(&engine)
    );
    let starter = {
        let config = config.clone();
        cortex_server::EngineStarter::new(move |model| {
            let engine = cortex_llama::start(&config.engine_config(model))?;
            eprintln!(
                "loaded {} on {}",
                model.name,
                crate::work::describe_device(&engine)
            );
            Ok(engine)
        })
    };
    if tcp {
        eprintln!("dashboard: http://{listen}/");
    }
    let server = config.server_config(plan, model, parallel, starter)?;
    drop(port_held);
    cortex_server::serve(server, engine)?;
    eprintln!("server stopped");
    Ok(())
}
