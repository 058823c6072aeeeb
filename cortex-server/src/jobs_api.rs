//! cortex's own view of the queue's jobs (what the dashboard shows, and
//! scripts may read): jobs with their throughput and ETA, filtered and
//! paged; one job's activity over time and its latencies; pages of its
//! items and each item whole; cancel, resume and retry. A job is seen only
//! by callers of its project (another project's job is no such job).

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::{Extension, Json};
use cortex_openai::batch_id;
use cortex_queue::{
    ItemQuery, ItemState, Job, JobActivity, JobFilter, JobId, JobState, JobStatus, Queue,
    QueueError,
};
use serde_json::{Value, json};

use crate::auth::Caller;
use crate::batch_api::{caller_job, files_of};
use crate::error::ApiError;
use crate::state::AppState;

type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// Most jobs or items one page holds.
const MOST_PER_PAGE: u64 = 200;

/// Refused batches listed with the jobs (the newest).
const MOST_REJECTED: usize = 10;

/// Spans of a job's activity chart.
const ACTIVITY_SPANS: usize = 60;

fn params(params: Params) -> Result<HashMap<String, String>, ApiError> {
    params
        .map(|Query(p)| p)
        .map_err(|e| ApiError::invalid(e.body_text(), None))
}

/// `offset` (default 0) and `limit` (1..=200, default 50).
fn paging(params: &HashMap<String, String>) -> Result<(u64, u64), ApiError> {
    let number = |name: &str, default: u64, range: std::ops::RangeInclusive<u64>| {
        params.get(name).map_or(Ok(default), |text| {
            text.parse::<u64>()
                .ok()
                .filter(|n| range.contains(n))
                .ok_or_else(|| {
                    ApiError::invalid(
                        format!(
                            "{name} = {text}: expected an integer from {} to {}",
                            range.start(),
                            range.end()
                        ),
                        Some(name.into()),
                    )
                })
        })
    };
    Ok((
        number("offset", 0, 0..=u64::from(u32::MAX))?,
        number("limit", 50, 1..=MOST_PER_PAGE)?,
    ))
}

/// A state filter from `state` (one of `names`).
fn state_param<T>(
    params: &HashMap<String, String>,
    parse: fn(&str) -> Option<T>,
    names: &str,
) -> Result<Option<T>, ApiError> {
    match params.get("state").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(text) => parse(text).map(Some).ok_or_else(|| {
            ApiError::invalid(
                format!("state = {text:?}: expected one of {names}"),
                Some("state".into()),
            )
        }),
    }
}

fn job_id(id: &str) -> Result<JobId, ApiError> {
    id.strip_prefix("batch_")
        .unwrap_or(id)
        .parse()
        .map(JobId)
        .map_err(|_| ApiError::not_found(format!("no job {id:?}: job ids are numbers")))
}

/// A job's status as shown: the queue's own shape, with its batch's id and
/// export files.
fn job_json(status: &JobStatus) -> Value {
    let mut value = serde_json::to_value(status).unwrap_or_default();
    value["batch_id"] = json!(batch_id(&status.job));
    // The same export files its batch names (once it has ended, each only
    // when it has lines).
    let files = files_of(&status.job);
    if let Some(output) = files.output_file_id {
        value["output_file_id"] = json!(output);
    }
    if let Some(errors) = files.error_file_id {
        value["error_file_id"] = json!(errors);
    }
    value
}

/// `GET /v1/jobs`: newest first, filtered by `state` and `model`, paged;
/// with the newest batches refused for bad lines.
pub(crate) async fn list(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    query: Params,
) -> Result<Json<Value>, ApiError> {
    let params = params(query)?;
    let (offset, limit) = paging(&params)?;
    let wanted = state_param(
        &params,
        JobState::parse,
        "validating, in_progress, finalizing, completed, failed, cancelling, cancelled",
    )?;
    // Batches refused for bad lines never became jobs; the newest are shown
    // with them, so a file sent through the Batch API and refused is seen.
    let mut rejected = state.files.failed_batches(caller.listing().as_deref());
    rejected.sort_by_key(|batch| std::cmp::Reverse(batch["created_at"].as_i64()));
    rejected.truncate(MOST_REJECTED);
    let filter = JobFilter {
        project: caller.listing(),
        state: wanted,
        model: params.get("model").filter(|m| !m.is_empty()).cloned(),
        offset: usize::try_from(offset).unwrap_or(usize::MAX),
        limit: Some(limit as usize),
        ..JobFilter::default()
    };
    state
        .with_store(move |store| {
            let page = store.job_page(&filter)?;
            let data = page
                .jobs
                .iter()
                .map(|job| store.status(job.id).map(|s| job_json(&s)))
                .collect::<Result<Vec<_>, QueueError>>()?;
            Ok(Json(json!({
                "matching": page.matching,
                "offset": offset,
                "data": data,
                "models": page.models,
                "rejected": rejected,
            })))
        })
        .await
}

/// `GET /v1/jobs/{id}`: the job, its activity over time and latencies.
pub(crate) async fn retrieve(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let id = job_id(&id)?;
    state
        .with_store(move |store| {
            caller_job(store, &caller, id)?;
            let status = store.status(id)?;
            let samples = store.completions(id)?;
            let activity = JobActivity::of(
                &status.job,
                &samples,
                cortex_queue::now_ms(),
                ACTIVITY_SPANS,
            );
            let mut value = job_json(&status);
            value["activity"] = serde_json::to_value(activity).unwrap_or_default();
            Ok(Json(value))
        })
        .await
}

/// `GET /v1/jobs/{id}/items`: a page of items in input order, filtered by
/// `state` and by text in `custom_id`.
pub(crate) async fn items(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Params,
) -> Result<Json<Value>, ApiError> {
    let id = job_id(&id)?;
    let params = params(query)?;
    let (offset, limit) = paging(&params)?;
    let item_query = ItemQuery {
        state: state_param(
            &params,
            ItemState::parse,
            "pending, running, completed, failed, cancelled",
        )?,
        custom_id: params.get("custom_id").cloned(),
        offset,
        limit,
    };
    state
        .with_store(move |store| {
            caller_job(store, &caller, id)?;
            let page = store.item_page(id, &item_query)?;
            Ok(Json(json!({
                "matching": page.matching,
                "offset": offset,
                "data": page.items,
            })))
        })
        .await
}

/// `GET /v1/jobs/{id}/items/{line}`: one item whole.
pub(crate) async fn item(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path((id, line)): Path<(String, String)>,
) -> Result<Json<Value>, ApiError> {
    let id = job_id(&id)?;
    let line: u64 = line
        .parse()
        .map_err(|_| ApiError::not_found(format!("no line {line:?}: lines are numbers")))?;
    state
        .with_store(move |store| {
            caller_job(store, &caller, id)?;
            Ok(Json(
                serde_json::to_value(store.item(id, line)?).unwrap_or_default(),
            ))
        })
        .await
}

/// What an action does to a job (as read just before): the items it changed.
type Action = fn(&mut dyn Queue, &Job) -> Result<u64, QueueError>;

async fn act(
    state: Arc<AppState>,
    caller: Caller,
    id: &str,
    action: Action,
) -> Result<Json<Value>, ApiError> {
    let id = job_id(id)?;
    state
        .with_store(move |store| {
            let job = caller_job(store, &caller, id)?;
            let changed = action(store, &job)?;
            let mut value = job_json(&store.status(id)?);
            value["changed_items"] = json!(changed);
            Ok(Json(value))
        })
        .await
}

/// `POST /v1/jobs/{id}/cancel`: pending items now, running ones at their
/// next heartbeat.
pub(crate) async fn cancel(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    // The items cancelled now (running ones follow at their heartbeat).
    act(state, caller, &id, |store, before| {
        let after = store.cancel(before.id)?;
        Ok(after
            .counts
            .cancelled
            .saturating_sub(before.counts.cancelled))
    })
    .await
}

/// `POST /v1/jobs/{id}/resume`: a cancelled or failed job's unfinished items
/// run again.
pub(crate) async fn resume(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    act(state, caller, &id, |store, job| Ok(store.resume(job.id)?.1)).await
}

/// `POST /v1/jobs/{id}/retry`: a job's failed items run again.
pub(crate) async fn retry(
    State(state): State<Arc<AppState>>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    act(state, caller, &id, |store, job| {
        Ok(store.retry_failed(job.id)?.1)
    })
    .await
}
