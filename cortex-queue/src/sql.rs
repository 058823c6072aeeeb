//! SQL text both SQL drivers run as it is: how the API lists a job's items
//! (the stored items with their results, and the lines `--skip-invalid`
//! refused as failed items). Each driver adds only what its dialect spells
//! differently.

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
