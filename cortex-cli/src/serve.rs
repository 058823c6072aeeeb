//! `cortex serve`: settings into a `cortex_server::ServerConfig`, the model
//! resolved and the engine started here, then the server runs until a signal.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use anyhow::Context;
use cortex_engine::Engine;
use cortex_server::ServerConfig;

use crate::config::Config;
use crate::worker::resolve_model;

/// The address to listen on: an IP, or a name such as `localhost`.
fn listen_address(config: &Config) -> anyhow::Result<SocketAddr> {
    let (host, port) = (&config.host.value, config.port.value);
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addresses| addresses.next())
        .with_context(|| {
            format!(
                "host {host:?} (from {}) is not an address this machine can listen on",
                config.host.source
            )
        })
}

pub(crate) fn serve(config: &Config) -> anyhow::Result<()> {
    let listen = listen_address(config)?;
    let keys = config.server_keys()?;
    let model = resolve_model(config)?;
    let parallel = config.parallel.value;
    let queue = config.queue()?;
    // Uploaded files and batch exports travel with the database they belong to.
    let files_dir = config.files_dir()?;
    let unix_socket = config.unix_socket();
    let tcp = !config.unix_socket_only.value;
    if keys.is_empty() && tcp {
        if listen.ip().is_loopback() {
            eprintln!(
                "no API keys: serving this machine only ({listen}); give --api-key KEY to serve others"
            );
        } else {
            eprintln!(
                "warning: no API keys on {listen}: anyone who can reach it can use it (give --api-key KEY)"
            );
        }
    }
    let engine = Engine::start(&config.engine(&model, parallel))?;
    let mut places: Vec<String> = Vec::new();
    if tcp {
        places.push(format!("http://{listen}"));
    }
    if let Some(path) = &unix_socket {
        places.push(format!("unix socket {} (mode 0600)", path.display()));
    }
    eprintln!(
        "serving {} on {} (OpenAI API under /v1, Ollama API under /api; {parallel} sequences, up to {} for batches), on {}",
        model.name,
        places.join(" and "),
        config.batch_parallel.value.min(parallel),
        crate::worker::describe_device(&engine)
    );
    let keep_alive = cortex_server::KeepAlive::parse_text(&config.keep_alive.value)
        .map_err(|e| anyhow::anyhow!("{e} (from {})", config.keep_alive.source))?;
    let starter = {
        let config = config.clone();
        cortex_server::EngineStarter::new(move |model| {
            let engine = Engine::start(&config.engine(model, parallel))?;
            eprintln!(
                "loaded {} on {}",
                model.name,
                crate::worker::describe_device(&engine)
            );
            Ok(engine)
        })
    };
    let mut server = ServerConfig::new(model, queue, files_dir, config.registry(), starter);
    server.models = cortex_server::PoolLimits {
        keep_alive,
        memory_budget: config.model_memory_mib.value << 20,
        max_loaded: config.max_loaded_models.value.max(1),
        ..cortex_server::PoolLimits::default()
    };
    server.model_switch = Duration::from_secs(config.model_switch_seconds.value);
    server.listen = listen;
    server.unix_socket = unix_socket;
    server.unix_socket_only = !tcp;
    server.api_keys = cortex_server::ApiKeys(keys);
    server.lease = Duration::from_secs(config.lease_seconds.value);
    server.batch_parallel = config.batch_parallel.value.min(parallel);
    server.max_request_tokens = config.max_request_tokens.value;
    server.max_online_requests = config.max_online_requests.value;
    server.max_online_requests_per_key = config.max_online_requests_per_key.value;
    server.max_connections = config.max_connections.value;
    server.header_timeout = Duration::from_secs(config.header_timeout_seconds.value.max(1));
    server.body_timeout = Duration::from_secs(config.body_timeout_seconds.value.max(1));
    server.max_client_priority = config.max_client_priority.value;
    server.max_project_file_bytes = config.max_project_file_bytes.value;
    server.file_retention =
        Duration::from_secs(config.file_retention_days.value.saturating_mul(24 * 3600));
    server.allowed_hosts = config.allowed_hosts.value.0.clone();
    server.allowed_origins = config.allowed_origins.value.0.clone();
    cortex_server::serve(server, engine)?;
    eprintln!("server stopped");
    Ok(())
}
