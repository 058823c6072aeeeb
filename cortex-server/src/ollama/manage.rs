//! Ollama's model management on the registry: `/api/tags` (what is
//! installed), `/api/ps` (what is loaded, till when), `/api/show`,
//! `/api/pull` (known models, with streamed progress), `/api/create` (from a
//! name or an uploaded blob, with a system prompt, template and
//! parameters), `HEAD`/`POST /api/blobs/sha256:…`, `/api/copy`,
//! `/api/delete` (refused while an unfinished job needs the weights), and
//! `/api/version`. The changing routes need an admin key when keys are set.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::SystemTime;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use cortex_models::{
    KNOWN_MODELS, ModelName, ModelSettings, ModelSpec, Modelfile, Parameter, RegistryError,
    model_info, parse_digest,
};
use futures_util::StreamExt as _;
use serde_json::{Map, Value, json};

use super::shape::{
    OLLAMA_VERSION, OllamaError, bad, capabilities, details, model_entry, not_found, object,
    template_of, text_field, timestamp,
};
use crate::online::body_bytes;
use crate::state::{AppState, off_async};

type Answer = Result<Response, OllamaError>;

/// A registry error as Ollama's client sees it.
impl From<RegistryError> for OllamaError {
    fn from(error: RegistryError) -> Self {
        let status = match &error {
            RegistryError::Unknown { .. } => StatusCode::NOT_FOUND,
            RegistryError::Name(_)
            | RegistryError::Modelfile(_)
            | RegistryError::Gguf(_)
            | RegistryError::Model(cortex_models::ModelError::DigestMismatch { .. })
            | RegistryError::NotRegistered { .. } => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        OllamaError(status, error.to_string())
    }
}

/// `model` (or the older `name`) of a body.
fn model_field(fields: &Map<String, Value>) -> Result<String, OllamaError> {
    match text_field(fields, "model")? {
        Some(model) if !model.is_empty() => Ok(model),
        _ => text_field(fields, "name")?
            .filter(|name| !name.is_empty())
            .ok_or_else(|| bad("model is required")),
    }
}

/// Lines of NDJSON from a channel a blocking task writes to.
fn ndjson(lines: tokio::sync::mpsc::UnboundedReceiver<Value>) -> Response {
    let stream = futures_util::stream::unfold(lines, |mut lines| async move {
        let line = lines.recv().await?;
        let mut bytes = line.to_string().into_bytes();
        bytes.push(b'\n');
        Some((Ok::<Bytes, Infallible>(Bytes::from(bytes)), lines))
    });
    (
        [(header::CONTENT_TYPE, "application/x-ndjson")],
        Body::from_stream(stream),
    )
        .into_response()
}

/// Whether the body asks for a stream (Ollama's default).
fn streaming(fields: &Map<String, Value>) -> Result<bool, OllamaError> {
    match fields.get("stream") {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(stream)) => Ok(*stream),
        Some(other) => Err(bad(format!("stream = {other}: expected true or false"))),
    }
}

/// Runs `work` off the async threads, telling its progress as lines: a
/// stream of them, or (not streaming) the last one alone, an error as a
/// status.
async fn progress(
    stream: bool,
    work: impl FnOnce(&dyn Fn(Value)) -> Result<(), OllamaError> + Send + 'static,
) -> Answer {
    let (sender, mut lines) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::task::spawn_blocking(move || {
        let send = |line: Value| {
            let _ = sender.send(line);
        };
        match work(&send) {
            Ok(()) => send(json!({ "status": "success" })),
            Err(OllamaError(_, message)) => send(json!({ "error": message })),
        }
    });
    if stream {
        return Ok(ndjson(lines));
    }
    task.await
        .map_err(|e| OllamaError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut last = json!({ "status": "success" });
    while let Ok(line) = lines.try_recv() {
        last = line;
    }
    match last.get("error").and_then(Value::as_str) {
        Some(message) => Err(OllamaError(StatusCode::BAD_REQUEST, message.to_owned())),
        None => Ok(Json(json!({ "status": "success" })).into_response()),
    }
}

pub(crate) async fn tags(State(state): State<Arc<AppState>>) -> Answer {
    let models = Arc::clone(&state.models);
    let started = state.started * 1000;
    let entries = off_async(move || {
        let default = models.default_model().clone();
        let listing = models.registry().list();
        let mut entries = Vec::new();
        if !listing
            .models
            .iter()
            .any(|m| m.name.to_string() == default.name)
        {
            entries.push(model_entry(&default, started));
        }
        for entry in listing.models {
            let modified = entry.modified_at_ms as i64;
            entries.push(model_entry(&entry.into(), modified));
        }
        entries
    })
    .await?;
    Ok(Json(json!({ "models": entries })).into_response())
}

pub(crate) async fn ps(State(state): State<Arc<AppState>>) -> Answer {
    let models = Arc::clone(&state.models);
    let running = off_async(move || {
        models
            .running()
            .into_iter()
            .map(|r| {
                let mut entry = model_entry(&r.model, cortex_queue::now_ms());
                // Kept for ever: Ollama shows a date far ahead.
                let expires = r.expires_at.unwrap_or_else(|| {
                    SystemTime::now() + std::time::Duration::from_secs(100 * 365 * 86_400)
                });
                let ms = expires
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                entry["expires_at"] = json!(timestamp(ms));
                entry["size"] = json!(r.size);
                entry["size_vram"] = json!(r.size_vram);
                entry
            })
            .collect::<Vec<_>>()
    })
    .await?;
    Ok(Json(json!({ "models": running })).into_response())
}

pub(crate) async fn show(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_bytes(&state, body)?;
    let models = Arc::clone(&state.models);
    let shown = off_async(move || {
        let fields = object(&body)?;
        let asked = model_field(&fields)?;
        let model = models.describe(Some(&asked))?;
        let (details, info) = details(&model);
        let Some(info) = info else {
            return Err(not_found(format!(
                "{} is known but not fetched yet: pull it first (POST /api/pull)",
                model.name
            )));
        };
        let template = template_of(&model, &info);
        // The file's name only: where the server keeps it is not the client's business.
        let from = model
            .path
            .file_name()
            .map_or_else(String::new, |name| name.to_string_lossy().into_owned());
        let modified = models
            .registry()
            .find(&model.name)
            .ok()
            .flatten()
            .map_or_else(cortex_queue::now_ms, |e| e.modified_at_ms as i64);
        Ok::<Value, OllamaError>(json!({
            "modelfile": model.settings.modelfile(&from),
            "parameters": model.settings.parameters_text(),
            "template": template,
            "system": model.settings.system.clone().unwrap_or_default(),
            "details": details,
            "model_info": model_info(&info),
            "capabilities": capabilities(&template),
            "modified_at": timestamp(modified),
        }))
    })
    .await??;
    Ok(Json(shown).into_response())
}

pub(crate) async fn version() -> Json<Value> {
    Json(json!({ "version": OLLAMA_VERSION }))
}

/// The known model a pull names.
fn known(asked: &str) -> Result<&'static ModelSpec, OllamaError> {
    let name: ModelName = asked
        .parse()
        .map_err(|e: cortex_models::NameError| bad(e.to_string()))?;
    let spec = if name.tag() == cortex_models::DEFAULT_TAG {
        KNOWN_MODELS
            .iter()
            .find(|spec| spec.name.eq_ignore_ascii_case(name.name()))
    } else {
        None
    };
    spec.ok_or_else(|| {
        let known: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        not_found(format!(
            "pull model manifest: cortex fetches only the models it knows ({}); add a local GGUF with /api/blobs and /api/create",
            known.join(", ")
        ))
    })
}

pub(crate) async fn pull(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_bytes(&state, body)?;
    let fields = object(&body)?;
    let spec = known(&model_field(&fields)?)?;
    let stream = streaming(&fields)?;
    let models = Arc::clone(&state.models);
    progress(stream, move |send| {
        send(json!({ "status": "pulling manifest" }));
        let digest = format!("sha256:{}", spec.sha256);
        let status = format!("pulling {}", &spec.sha256[..12]);
        let mut shown = u64::MAX;
        let mut tell = |completed: u64, total: u64| {
            let percent = completed * 100 / total.max(1);
            if percent != shown {
                shown = percent;
                send(json!({ "status": status, "digest": digest, "total": total, "completed": completed }));
            }
        };
        tell(0, spec.size);
        models
            .registry()
            .pull_with(spec.name, &mut |p| tell(p.completed, p.total))
            .map_err(OllamaError::from)?;
        tell(spec.size, spec.size);
        send(json!({ "status": "verifying sha256 digest" }));
        send(json!({ "status": "writing manifest" }));
        Ok(())
    })
    .await
}

/// `parameters` of a create: Ollama's option names with a value, or a list
/// of values (`stop`).
fn parameters(value: Option<&Value>) -> Result<Vec<Parameter>, OllamaError> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let Value::Object(map) = value else {
        return Err(bad(format!("parameters = {value}: expected an object")));
    };
    let mut parameters = Vec::new();
    for (name, value) in map {
        let values = match value {
            Value::Array(values) => values.clone(),
            other => vec![other.clone()],
        };
        for value in values {
            let text = match &value {
                Value::String(text) => text.clone(),
                Value::Number(n) => n.to_string(),
                other => {
                    return Err(bad(format!(
                        "parameters.{name} = {other}: expected a number or a string"
                    )));
                }
            };
            parameters
                .push(Parameter::parse(name, &text).map_err(|e| bad(format!("parameters: {e}")))?);
        }
    }
    Ok(parameters)
}

pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_bytes(&state, body)?;
    let fields = object(&body)?;
    let name = model_field(&fields)?;
    for refused in ["quantize", "adapters", "messages"] {
        if fields
            .get(refused)
            .is_some_and(|v| !v.is_null() && v != &json!([]) && v != &json!({}))
        {
            return Err(bad(format!("{refused} is not supported by cortex")));
        }
    }
    // The older form: a whole Modelfile; else `from` (a name) or `files`
    // (one uploaded GGUF), with system, template and parameters beside.
    let modelfile = match text_field(&fields, "modelfile")? {
        Some(text) => Modelfile::parse(&text).map_err(|e| bad(e.to_string()))?,
        None => {
            let from = match (text_field(&fields, "from")?, fields.get("files")) {
                (Some(from), _) => from,
                (None, Some(Value::Object(files))) if files.len() == 1 => {
                    let digest = files.values().next().and_then(Value::as_str).unwrap_or("");
                    let sha = parse_digest(digest)
                        .ok_or_else(|| bad(format!("files: {digest:?} is not a sha256 digest")))?;
                    format!("sha256:{sha}")
                }
                (None, Some(_)) => {
                    return Err(bad("files must map one GGUF's name to its uploaded digest"));
                }
                (None, None) => return Err(bad("from or files is required")),
            };
            Modelfile {
                from,
                settings: ModelSettings {
                    system: text_field(&fields, "system")?,
                    template: text_field(&fields, "template")?,
                    parameters: parameters(fields.get("parameters"))?,
                },
            }
        }
    };
    if cortex_models::is_path(&modelfile.from) {
        return Err(bad(
            "from must name a model or an uploaded blob (sha256:…), not a path on the server",
        ));
    }
    if let Some(template) = &modelfile.settings.template {
        cortex_models::check_template_shape(template).map_err(|e| bad(format!("template: {e}")))?;
    }
    let stream = streaming(&fields)?;
    let models = Arc::clone(&state.models);
    progress(stream, move |send| {
        send(json!({ "status": format!("using {}", modelfile.from) }));
        let root = models.registry().root().to_owned();
        models
            .registry()
            .create(&name, &modelfile, &root)
            .map_err(OllamaError::from)?;
        send(json!({ "status": "writing manifest" }));
        Ok(())
    })
    .await
}

fn digest_of(path: &str) -> Result<String, OllamaError> {
    parse_digest(path)
        .filter(|_| path.starts_with("sha256:"))
        .ok_or_else(|| {
            bad(format!(
                "{path:?} is not a digest: expected sha256:<64 hex digits>"
            ))
        })
}

pub(crate) async fn has_blob(
    State(state): State<Arc<AppState>>,
    Path(digest): Path<String>,
) -> Answer {
    let sha = digest_of(&digest)?;
    let models = Arc::clone(&state.models);
    let present = off_async(move || models.registry().has_blob(&sha))
        .await?
        .map_err(OllamaError::from)?;
    if present {
        Ok(StatusCode::OK.into_response())
    } else {
        Err(not_found(format!("no blob {digest}")))
    }
}

/// Receives a GGUF's bytes, chunk by chunk (never whole in memory), hashed
/// as they are written; stored only if they have the digest they were sent as.
pub(crate) async fn upload_blob(
    State(state): State<Arc<AppState>>,
    Path(digest): Path<String>,
    body: Body,
) -> Answer {
    digest_of(&digest)?;
    let limit = state.config.max_blob_bytes;
    let writer = {
        let models = Arc::clone(&state.models);
        off_async(move || models.registry().blob_writer())
            .await?
            .map_err(OllamaError::from)?
    };
    let (chunks, received) = std::sync::mpsc::sync_channel::<Bytes>(16);
    let expected = digest.clone();
    let stored = tokio::task::spawn_blocking(move || {
        let mut writer = writer;
        for chunk in received {
            std::io::Write::write_all(&mut writer, &chunk)
                .map_err(|e| OllamaError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        }
        writer
            .finish(Some(&expected))
            .map_err(|e| OllamaError::from(RegistryError::from(e)))
    });
    let mut body = body.into_data_stream();
    let mut bytes = 0usize;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| bad(format!("the upload: {e}")))?;
        bytes += chunk.len();
        if bytes > limit {
            // Dropping the writer's channel and the writer removes what was written.
            return Err(OllamaError(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("a blob may hold at most {limit} bytes (max_blob_bytes)"),
            ));
        }
        let sender = chunks.clone();
        off_async(move || sender.send(chunk)).await?.map_err(|_| {
            OllamaError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the blob writer stopped".into(),
            )
        })?;
    }
    drop(chunks);
    stored
        .await
        .map_err(|e| OllamaError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))??;
    Ok(StatusCode::CREATED.into_response())
}

pub(crate) async fn copy(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_bytes(&state, body)?;
    let fields = object(&body)?;
    let source = text_field(&fields, "source")?.ok_or_else(|| bad("source is required"))?;
    let destination =
        text_field(&fields, "destination")?.ok_or_else(|| bad("destination is required"))?;
    let models = Arc::clone(&state.models);
    off_async(move || models.registry().copy(&source, &destination))
        .await?
        .map_err(OllamaError::from)?;
    Ok(StatusCode::OK.into_response())
}

pub(crate) async fn delete(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Answer {
    let body = body_bytes(&state, body)?;
    let fields = object(&body)?;
    let asked = model_field(&fields)?;
    let registry = state.models.registry().clone();
    let entry = off_async({
        let registry = registry.clone();
        let asked = asked.clone();
        move || registry.find(&asked)
    })
    .await?
    .map_err(OllamaError::from)?
    .ok_or_else(|| not_found(format!("model {asked:?} not found")))?;
    let shared = {
        let (registry, entry) = (registry.clone(), entry.clone());
        off_async(move || registry.shares_weights(&entry)).await?
    };
    if !shared && entry.sha256 == state.models.default_model().sha256 {
        return Err(OllamaError(
            StatusCode::CONFLICT,
            format!(
                "{} holds the weights of this server's default model: give them another name first (/api/copy), or serve another model",
                entry.name
            ),
        ));
    }
    if !shared {
        let sha = entry.sha256.clone();
        let needing = state
            .with_store(move |store| Ok(cortex_worker::jobs_needing(store, &sha)?))
            .await?;
        if !needing.is_empty() {
            let ids: Vec<String> = needing.iter().map(|j| j.id.to_string()).collect();
            return Err(OllamaError(
                StatusCode::CONFLICT,
                format!(
                    "{} is needed by unfinished job(s) {}: let them finish or cancel them first",
                    entry.name,
                    ids.join(", ")
                ),
            ));
        }
    }
    let name = entry.name.to_string();
    let sha = entry.sha256.clone();
    let models = Arc::clone(&state.models);
    off_async(move || {
        // Weights that go are unloaded too (when idle; else after their requests).
        if !shared {
            models.unload(&sha);
        }
        models.registry().remove(&name)
    })
    .await?
    .map_err(OllamaError::from)?;
    Ok(StatusCode::OK.into_response())
}
