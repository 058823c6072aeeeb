//! OpenAI's Files and Batches routes. A batch is a queue job: created from
//! an uploaded file with the same validation as `cortex submit` (a file
//! with bad lines gives a `failed` batch listing them), listed beside jobs
//! submitted by the CLI, cancelled as a job is; its output and error files
//! are the job's export (`file-batch_ID-output`, `file-batch_ID-errors`).
//! Files and batches belong to the caller's project: another project's are
//! "no such object" (404), and lists hold only one's own (an admin's, all).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::multipart::{Field, Multipart, MultipartRejection};
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use cortex_openai::{
    BatchFiles, BatchRequest, ExportJsonl, FileInfo, SubmitJsonl, batch_object, check_batch,
    failed_batch_object, file_deleted_object, file_object, list_object,
};
use cortex_queue::{Job, JobFilter, JobId, Queue, QueueError, SubmitOptions};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio_util::io::ReaderStream;

use crate::auth::Caller;
use crate::error::ApiError;
use crate::files::PendingUpload;
use crate::online::body_bytes;
use crate::state::{AppState, off_async};

type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

fn io_error(error: &std::io::Error) -> ApiError {
    ApiError::internal(format!("the files directory: {error}"))
}

fn no_file(id: &str) -> ApiError {
    ApiError::not_found(format!("No such File object: {id}"))
}

fn no_batch(id: &str) -> ApiError {
    ApiError::not_found(format!("No such Batch object: {id}"))
}

/// `after` and `limit` (1..=100, default 20) of a list request.
fn page(params: Params) -> Result<(Option<String>, usize), ApiError> {
    let Query(params) = params.map_err(|e| ApiError::invalid(e.body_text(), None))?;
    let limit = match params.get("limit") {
        None => 20,
        Some(text) => match text.parse::<usize>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid(
                    format!("limit = {text}: expected an integer from 1 to 100"),
                    Some("limit".into()),
                ));
            }
        },
    };
    Ok((params.get("after").cloned(), limit))
}

/// The objects after the one with id `after`, at most `limit`, as a list.
fn paginate(all: Vec<Value>, after: Option<&str>, limit: usize) -> Value {
    let start = after
        .and_then(|id| all.iter().position(|v| v["id"] == id).map(|i| i + 1))
        .unwrap_or(0);
    let rest: Vec<Value> = all.into_iter().skip(start).collect();
    let has_more = rest.len() > limit;
    list_object(rest.into_iter().take(limit).collect(), has_more)
}

// ---- Files ----

pub(crate) async fn upload(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<Value>, ApiError> {
    let mut multipart = multipart.map_err(|e| ApiError::invalid(e.body_text(), None))?;
    let limit = state.config.max_file_bytes;
    let mut purpose = None;
    let mut file = None;
    while let Some(field) = multipart.next_field().await.map_err(|e| {
        ApiError::body(
            e.status(),
            limit,
            format!("the multipart body: {}", e.body_text()),
        )
    })? {
        match field.name().unwrap_or_default() {
            "purpose" => {
                purpose = Some(
                    field
                        .text()
                        .await
                        .map_err(|e| ApiError::invalid(e.body_text(), Some("purpose".into())))?,
                );
            }
            "file" => {
                let name = field.file_name().unwrap_or("upload.jsonl").to_owned();
                file = Some((name, receive(&state, &caller, field).await?));
            }
            other => {
                return Err(ApiError::invalid(
                    format!("unknown field {other:?} (give file and purpose)"),
                    Some(other.to_owned()),
                ));
            }
        }
    }
    let Some((name, (pending, written))) = file else {
        return Err(ApiError::invalid("missing file", Some("file".into())));
    };
    match purpose.as_deref() {
        Some("batch") => {}
        None => return Err(ApiError::invalid("missing purpose", Some("purpose".into()))),
        Some(other) => {
            return Err(ApiError::invalid(
                format!(
                    "purpose {other:?} is not supported; cortex keeps batch inputs (purpose \"batch\")"
                ),
                Some("purpose".into()),
            ));
        }
    }
    let files = Arc::clone(&state);
    let info = off_async(move || files.files.finish_upload(pending, written, &name, "batch"))
        .await?
        .map_err(|e| io_error(&e))?;
    Ok(Json(file_object(&info)))
}

/// Receives an upload's file field into a temporary file, chunk by chunk
/// (never whole in memory), counting it against the caller's quota. Over
/// the quota, the rest is read and dropped before the 413, so the client
/// gets the answer rather than a connection reset mid-upload.
async fn receive(
    state: &AppState,
    caller: &Caller,
    mut field: Field<'_>,
) -> Result<(PendingUpload, std::fs::File), ApiError> {
    let limit = state.config.max_file_bytes;
    let (mut pending, file) = state
        .files
        .begin_upload(&caller.project)
        .map_err(|e| io_error(&e))?;
    let mut out = tokio::fs::File::from_std(file);
    let mut refused = None;
    while let Some(chunk) = field
        .chunk()
        .await
        .map_err(|e| ApiError::body(e.status(), limit, format!("the file: {}", e.body_text())))?
    {
        if refused.is_some() {
            continue;
        }
        match pending.grow(chunk.len() as u64) {
            Ok(()) => out.write_all(&chunk).await.map_err(|e| io_error(&e))?,
            Err(over) => refused = Some(ApiError::quota(over.to_string())),
        }
    }
    if let Some(refusal) = refused {
        // Dropping the pending upload removes what was written.
        return Err(refusal);
    }
    out.flush().await.map_err(|e| io_error(&e))?;
    Ok((pending, out.into_std().await))
}

/// `GET /v1/files`: the caller's uploads and the output and error files of
/// its ended batches (purpose `batch_output`), newest first unless `order`
/// is `asc`, only those of `purpose` when given, paged by `after` and
/// `limit`. A batch's files are written when first listed or read.
pub(crate) async fn list_files(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    let query = params
        .as_ref()
        .map(|Query(q)| q.clone())
        .unwrap_or_default();
    let (after, limit) = page(params)?;
    let ascending = match query.get("order").map(String::as_str) {
        None | Some("desc") => false,
        Some("asc") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                format!("order = {other}: expected asc or desc"),
                Some("order".into()),
            ));
        }
    };
    let purpose = query.get("purpose").cloned();
    let project = caller.listing();
    // Every file the caller may see, as (created_at, id, upload): the
    // uploads from the index, the batches' files from their jobs.
    let uploads = state.files.uploads(project.as_deref());
    let jobs = jobs_of(&state, project).await?;
    let mut all: Vec<(i64, String, Option<FileInfo>)> = uploads
        .into_iter()
        .filter(|info| purpose.as_deref().is_none_or(|p| p == info.purpose))
        .map(|info| (info.created_at, info.id.clone(), Some(info)))
        .collect();
    if purpose.as_deref().is_none_or(|p| p == "batch_output") {
        for job in jobs.iter().filter(|job| job.state.is_terminal()) {
            let files = files_of(job);
            for id in [files.output_file_id, files.error_file_id]
                .into_iter()
                .flatten()
            {
                all.push((ended_at(job) / 1000, id, None));
            }
        }
    }
    all.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    if !ascending {
        all.reverse();
    }
    let start = after
        .as_deref()
        .and_then(|id| {
            all.iter()
                .position(|(_, other, _)| other == id)
                .map(|i| i + 1)
        })
        .unwrap_or(0);
    let more = all.len() > start + limit;
    let mut data = Vec::new();
    for (_, id, upload) in all.into_iter().skip(start).take(limit) {
        let info = match upload {
            Some(info) => info,
            None => find_file(&state, &caller, &id).await?.0,
        };
        data.push(file_object(&info));
    }
    Ok(Json(list_object(data, more)))
}

/// A batch's export, by its file id: (job, `output` or `errors`).
fn export_id(id: &str) -> Option<(JobId, &'static str)> {
    let rest = id.strip_prefix("file-batch_")?;
    let (job, part) = if let Some(job) = rest.strip_suffix("-output") {
        (job, "output")
    } else {
        (rest.strip_suffix("-errors")?, "errors")
    };
    job.parse().ok().map(|n| (JobId(n), part))
}

/// When a finished job ended (Unix ms; it may end again after a resume or a retry).
fn ended_at(job: &Job) -> i64 {
    let times = &job.times;
    times
        .completed_at
        .or(times.failed_at)
        .or(times.cancelled_at)
        .or(times.expired_at)
        .unwrap_or(times.created_at)
}

/// Exports a finished job (both files) and gives the path of `part`. The
/// files are named by when the job ended, so they are written once per
/// ending and every later request reads them as they are.
fn export(
    store: &mut dyn Queue,
    state: &AppState,
    caller: &Caller,
    job: JobId,
    part: &str,
) -> Result<(Job, PathBuf), ApiError> {
    let record = caller_job(store, caller, job)?;
    if !record.state.is_terminal() {
        return Err(ApiError::not_found(format!(
            "batch_{job} is {}; its files exist once it has ended",
            record.state.as_str()
        )));
    }
    let batch = format!("batch_{job}-{}", ended_at(&record));
    let output = state.files.export_path(&batch, "output");
    let errors = state.files.export_path(&batch, "errors");
    if !(output.is_file() && errors.is_file()) {
        store.export(job, &output, Some(&errors), false)?;
        state
            .files
            .forget_other_exports(job.0, &batch)
            .map_err(|e| io_error(&e))?;
    }
    Ok((record, if part == "output" { output } else { errors }))
}

/// A file's record and where its content is (uploads and batch exports),
/// if `caller` may see it.
async fn find_file(
    state: &Arc<AppState>,
    caller: &Caller,
    id: &str,
) -> Result<(FileInfo, PathBuf), ApiError> {
    if let Some((job, part)) = export_id(id) {
        let id = id.to_owned();
        let inner = Arc::clone(state);
        let caller = caller.clone();
        return state
            .with_store(move |store| {
                let (record, path) = export(store, &inner, &caller, job, part)?;
                let bytes = std::fs::metadata(&path).map_err(|e| io_error(&e))?.len();
                let info = FileInfo {
                    bytes,
                    created_at: ended_at(&record) / 1000,
                    filename: format!("batch_{job}_{part}.jsonl"),
                    purpose: "batch_output".into(),
                    id,
                };
                Ok((info, path))
            })
            .await;
    }
    upload_of(state, caller, id)
}

/// An upload's record and where its content is, if `caller` may see it;
/// another project's upload is no such file.
fn upload_of(state: &AppState, caller: &Caller, id: &str) -> Result<(FileInfo, PathBuf), ApiError> {
    let stored = state
        .files
        .get(id)
        .filter(|stored| caller.sees(&stored.project))
        .ok_or_else(|| no_file(id))?;
    let path = state.files.content_path(id);
    Ok((stored.info, path))
}

pub(crate) async fn retrieve_file(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let (info, _) = find_file(&state, &caller, &id).await?;
    Ok(Json(file_object(&info)))
}

pub(crate) async fn file_content(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let (_, path) = find_file(&state, &caller, &id).await?;
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| io_error(&e))?;
    let length = file.metadata().await.map_err(|e| io_error(&e))?.len();
    // Sent as it is read, never whole in memory.
    let body = Body::from_stream(ReaderStream::with_capacity(file, 1 << 16));
    Ok((
        [
            (header::CONTENT_TYPE, "application/jsonl".to_owned()),
            (header::CONTENT_LENGTH, length.to_string()),
        ],
        body,
    )
        .into_response())
}

pub(crate) async fn delete_file(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    if export_id(&id).is_some() {
        return Err(ApiError::invalid(
            format!("{id} is a batch's export; it is made from the queue and cannot be deleted"),
            None,
        ));
    }
    upload_of(&state, &caller, &id)?;
    if !state.files.delete(&id).map_err(|e| io_error(&e))? {
        return Err(no_file(&id));
    }
    Ok(Json(file_deleted_object(&id)))
}

// ---- Batches ----

/// The export files a job's batch names: once it has ended, each only when
/// it has lines.
pub(crate) fn files_of(job: &Job) -> BatchFiles {
    if !job.state.is_terminal() {
        return BatchFiles::default();
    }
    let counts = &job.counts;
    BatchFiles {
        output_file_id: (counts.completed > 0).then(|| format!("file-batch_{}-output", job.id)),
        error_file_id: (counts.failed + counts.cancelled > 0)
            .then(|| format!("file-batch_{}-errors", job.id)),
    }
}

fn job_batch(job: &Job) -> Value {
    batch_object(job, &files_of(job))
}

/// The model a batch file's lines name (`cortex_openai::named_model`).
fn batch_model(path: &std::path::Path) -> Result<Option<String>, ApiError> {
    let file = std::fs::File::open(path).map_err(|e| io_error(&e))?;
    cortex_openai::named_model(std::io::BufReader::new(file))
        .map(|named| named.map(|n| n.name))
        .map_err(|message| ApiError::invalid(message, Some("input_file_id".into())))
}

pub(crate) async fn create_batch(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body_bytes(&state, body)?;
    let request =
        BatchRequest::parse(&body).map_err(|(m, p)| ApiError::invalid(m, p.map(Into::into)))?;
    let (info, path) = upload_of(&state, &caller, &request.input_file_id)?;
    let (model, chats_refused) = {
        let (models, path) = (Arc::clone(&state.models), path.clone());
        let chosen = state.config.chat_template.clone();
        off_async(move || {
            let named = batch_model(&path)?;
            let model = models.describe(named.as_deref())?;
            // Chats for a model that cannot render them are refused now,
            // line by line, not failed later.
            let refused = model.chat_refusal(chosen.as_deref());
            Ok::<_, ApiError>((model, refused))
        })
        .await??
    };
    let mut options = SubmitOptions::new(model.name.clone());
    options.chats_refused = chats_refused;
    options.model_sha256 = Some(model.sha256.clone());
    options.defaults = cortex_worker::model_defaults(&model.settings);
    options.chat_template = state.config.chat_template.clone();
    options.defaults.chat_template = model.chat_template(options.chat_template.as_deref());
    options.project = caller.project.to_string();
    options.max_attempts = state.config.max_attempts;
    options.notify_url = state.config.webhook_url.clone();
    // Two batches of one file are two batches.
    options.force = true;
    // Every line is read and checked before the store is taken: a bad
    // file never holds it, a good one holds it only to be stored.
    let checked = {
        let (path, options, request, name) = (
            path.clone(),
            options.clone(),
            request.clone(),
            info.filename.clone(),
        );
        off_async(move || {
            let file = std::fs::File::open(&path).map_err(|e| io_error(&e))?;
            Ok::<_, ApiError>(check_batch(file, &name, &options, &request))
        })
        .await??
    };
    let batch = match checked {
        Ok(_) => {
            state
                .with_store(move |store| {
                    let file = std::fs::File::open(&path).map_err(|e| io_error(&e))?;
                    let submitted = store.submit_batch(file, &info.filename, &options, &request)?;
                    Ok(job_batch(&store.job(submitted.job)?))
                })
                .await?
        }
        Err(QueueError::InvalidInput(report)) => {
            let id = state.files.new_id("batch_failed_");
            let batch = failed_batch_object(
                &id,
                &request,
                cortex_queue::now_ms() / 1000,
                &report.errors,
                &report.to_string(),
            );
            let files = Arc::clone(&state);
            off_async(move || {
                files
                    .files
                    .save_failed_batch(&id, &batch, &caller.project)
                    .map(|()| batch)
            })
            .await?
            .map_err(|e| io_error(&e))?
        }
        Err(other) => return Err(other.into()),
    };
    Ok(Json(batch))
}

/// The job `id` if `caller` may see it; another project's job is no such job.
pub(crate) fn caller_job(
    store: &mut dyn Queue,
    caller: &Caller,
    id: JobId,
) -> Result<Job, QueueError> {
    store
        .job(id)
        .and_then(|job| match caller.sees(&job.project) {
            true => Ok(job),
            false => Err(QueueError::NoSuchJob(id)),
        })
}

/// A job the queue gave back as its batch; no such job is no such batch.
fn batch_of(job: Result<Job, QueueError>) -> Result<Value, ApiError> {
    match job {
        Ok(job) => Ok(job_batch(&job)),
        Err(QueueError::NoSuchJob(id)) => Err(no_batch(&format!("batch_{id}"))),
        Err(other) => Err(other.into()),
    }
}

/// The job of a batch id (`None` for a failed batch's id).
fn job_of(id: &str) -> Option<JobId> {
    id.strip_prefix("batch_")?.parse().ok().map(JobId)
}

/// A failed batch's object, if `caller` may see it.
fn failed_batch(state: &AppState, caller: &Caller, id: &str) -> Option<Value> {
    state
        .files
        .failed_batch(id)
        .filter(|failed| caller.sees(&failed.project))
        .map(|failed| failed.batch)
}

pub(crate) async fn retrieve_batch(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let Some(job) = job_of(&id) else {
        return failed_batch(&state, &caller, &id)
            .map(Json)
            .ok_or_else(|| no_batch(&id));
    };
    let batch = state
        .with_store(move |store| batch_of(caller_job(store, &caller, job)))
        .await?;
    Ok(Json(batch))
}

/// Every job of `project` (of every project for `None`: an admin's view).
async fn jobs_of(state: &Arc<AppState>, project: Option<String>) -> Result<Vec<Job>, ApiError> {
    let filter = JobFilter {
        project,
        ..JobFilter::default()
    };
    state
        .with_store(move |store| Ok(store.jobs(&filter)?))
        .await
}

pub(crate) async fn list_batches(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    params: Params,
) -> Result<Json<Value>, ApiError> {
    let (after, limit) = page(params)?;
    let project = caller.listing();
    let jobs = jobs_of(&state, project.clone()).await?;
    let mut all: Vec<Value> = jobs.iter().map(job_batch).collect();
    all.extend(state.files.failed_batches(project.as_deref()));
    // Newest first; ids break ties so pages are stable.
    all.sort_by(|a, b| {
        (b["created_at"].as_i64(), b["id"].as_str())
            .cmp(&(a["created_at"].as_i64(), a["id"].as_str()))
    });
    Ok(Json(paginate(all, after.as_deref(), limit)))
}

pub(crate) async fn cancel_batch(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let Some(job) = job_of(&id) else {
        return match failed_batch(&state, &caller, &id) {
            Some(_) => Err(ApiError::conflict(format!(
                "{id} has failed; there is nothing to cancel"
            ))),
            None => Err(no_batch(&id)),
        };
    };
    let batch = state
        .with_store(move |store| {
            batch_of(caller_job(store, &caller, job).and_then(|_| store.cancel(job)))
        })
        .await?;
    Ok((StatusCode::OK, Json(batch)).into_response())
}
