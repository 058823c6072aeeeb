//! SQL text both SQL drivers run as it is: how the API lists a job's items
//! (the stored items with their results, and the lines `--skip-invalid`
//! refused as failed items), and what a worker death writes to the items it
//! had in flight. Each driver adds only what its dialect spells differently.

use crate::Job;

/// An item's columns as the API lists it (`i`: items, `r`: results), in
/// the order a driver's row reader takes them.
pub const ITEM_COLUMNS: &str =
    "i.id, i.line, i.custom_id, i.state, i.attempts, i.lease_token, i.error_code,
    i.error_message, r.completed_at, i.deaths, i.ran_by, r.completion_tokens, r.duration_ms";

/// How many columns [`ITEM_COLUMNS`] and [`LISTED_COLUMNS`] are.
pub const ITEM_COLUMN_COUNT: usize = 13;

/// [`ITEM_COLUMNS`] of a listing's rows (alias `i`: see [`listed_items`]).
pub const LISTED_COLUMNS: &str = "i.id, i.line, i.custom_id, i.state, i.attempts, i.lease_token,
    i.error_code, i.error_message, i.completed_at, i.deaths, i.ran_by, i.completion_tokens,
    i.duration_ms";

/// The stored items as a listing's rows: [`ITEM_COLUMNS`] and `job_id`,
/// `endpoint`, `request`, `response`.
const STORED_ITEMS: &str = "SELECT i.id, i.line, i.custom_id, i.state, i.attempts, i.lease_token,
        i.error_code, i.error_message, r.completed_at, i.deaths, i.ran_by, r.completion_tokens,
        r.duration_ms, i.job_id, i.endpoint, i.request, r.response
    FROM items i LEFT JOIN results r ON r.item_id = i.id";

/// What a job's items are listed from, to be aliased `i`: its stored items,
/// and when it has refused lines, those too (`refused`: the driver's
/// `SELECT` of `input_errors` as rows of the same columns, each a failed
/// item with its line and its error `invalid_input`). A job without refused
/// lines lists straight from the items' index.
pub fn listed_items(job: &Job, refused: &str) -> String {
    if job.counts.invalid > 0 {
        format!("({STORED_ITEMS} UNION ALL {refused})")
    } else {
        format!("({STORED_ITEMS})")
    }
}

/// How a driver spells what [`death_assignments`] reads: each field an SQL
/// expression in the driver's dialect.
#[derive(Debug, Clone, Copy)]
pub struct DeathSpelling<'a> {
    /// The items' columns' qualifier (`"i."`, or `""` where unqualified).
    pub item: &'a str,
    /// The item's job's state.
    pub job_state: &'a str,
    /// The item's job's `max_attempts`.
    pub max_attempts: &'a str,
    /// Whether the death is the item's own doing (a condition): it ran
    /// alone, and the death before this one was its own lone run too.
    pub charged: &'a str,
    /// Whether the item ran alone (a condition).
    pub alone: &'a str,
    /// The death's cause (text).
    pub cause: &'a str,
    /// Now, in Unix ms.
    pub now: &'a str,
    /// The lone suspects' retry delay in ms (see `RetryPolicy::lone_retry`).
    pub lone_retry: &'a str,
    /// The function giving the smaller of two integers (`min`, `least`).
    pub smaller: &'a str,
}

/// The `SET` list of the update a worker death makes to an item it had in
/// flight: the rule every driver charges deaths by, and its messages. The
/// death counts as an attempt only when it is the item's own doing
/// ([`DeathSpelling::charged`]), and after the job's `max_attempts` the item
/// fails with `worker_lost`; otherwise the attempt is given back and the item
/// becomes a suspect one level deeper (smaller groups next time). Items of
/// cancelling jobs end cancelled. A lone suspect waits `lone_retry` (doubled
/// per attempt charged, up to 32 times) before it runs alone again.
pub fn death_assignments(s: &DeathSpelling<'_>) -> String {
    let DeathSpelling {
        item: i,
        job_state,
        max_attempts,
        charged,
        alone,
        cause,
        now,
        lone_retry,
        smaller,
    } = *s;
    let given_back = format!("(CASE WHEN {charged} THEN 0 ELSE 1 END)");
    format!(
        "state = CASE
            WHEN {job_state} = 'cancelling' THEN 'cancelled'
            WHEN {charged} AND {i}attempts >= {max_attempts} THEN 'failed'
            ELSE 'pending' END,
        attempts = {i}attempts - {given_back},
        deaths = {i}deaths + 1,
        error_code = 'worker_lost',
        error_message = CASE
            WHEN {charged}
            THEN {cause} || ', with this item alone in it, as at the death before (' || {i}attempts || ' of ' ||
                 {max_attempts} || ' attempts; ' || ({i}deaths + 1) || ' deaths in all)'
            WHEN {alone}
            THEN {cause} || ' (not counted as an attempt: it ran alone, but the death before was not its own; ' ||
                 ({i}deaths + 1) || ' deaths so far)'
            ELSE {cause} || ' (not counted as an attempt: other items were in flight; ' ||
                 ({i}deaths + 1) || ' deaths so far)' END,
        not_before = CASE WHEN {alone}
            THEN {now} + ({lone_retry} << {smaller}({i}attempts - {given_back}, 5)) ELSE 0 END,
        worker_id = NULL, lease_expires_at = NULL, updated_at = {now}"
    )
}
