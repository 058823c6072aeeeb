//! What a dashboard or a script reads about a job beyond its counts: one page
//! of its items, one item whole, its completions over time and their
//! latencies, and the workers registered on the queue.

use serde::{Deserialize, Serialize};

use crate::{ItemRecord, ItemState, Job};

/// Which items of a job to show, one page at a time, in input order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ItemQuery {
    /// Only items in this state.
    pub state: Option<ItemState>,
    /// Only items whose `custom_id` contains this text.
    pub custom_id: Option<String>,
    /// Items to skip (of those that match).
    pub offset: u64,
    /// At most this many.
    pub limit: u64,
}

/// One page of a job's items.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemPage {
    /// How many items match the query in all.
    pub matching: u64,
    /// The page.
    pub items: Vec<ItemRecord>,
}

/// One item whole: where it is, what it asked and what it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemDetail {
    /// Its record.
    #[serde(flatten)]
    pub record: ItemRecord,
    /// The endpoint its line named (`/v1/chat/completions`, ...).
    pub endpoint: String,
    /// The request as stored (settings left at their defaults are not shown).
    pub request: serde_json::Value,
    /// Its result, once completed.
    pub response: Option<serde_json::Value>,
}

/// An item whole from its stored columns: the request and response as
/// stored (JSON text; text that is not JSON is shown as a string).
pub fn item_detail(
    record: ItemRecord,
    endpoint: String,
    request: &str,
    response: Option<&str>,
) -> ItemDetail {
    let json = |text: &str| {
        serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_owned()))
    };
    ItemDetail {
        record,
        endpoint,
        request: json(request),
        response: response.filter(|r| !r.is_empty()).map(json),
    }
}

/// One completed item: when, how many tokens, how long it took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionSample {
    /// When its result was written (Unix ms).
    pub completed_at: i64,
    /// Tokens it generated.
    pub completion_tokens: u64,
    /// From entering the engine to its first token (ms), when known.
    pub first_token_ms: Option<u64>,
    /// From entering the engine to its end (ms), when known.
    pub duration_ms: Option<u64>,
}

/// Completions in one span of a job's life.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ActivityBucket {
    /// Start of the span (Unix ms).
    pub start: i64,
    /// Items completed in it.
    pub completed: u64,
    /// Tokens those items generated.
    pub tokens: u64,
}

/// The spread of a latency over a job's items (ms).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Distribution {
    /// Items measured.
    pub count: u64,
    /// Percentiles: 50th, 90th, 99th and the largest.
    pub p50: Option<u64>,
    /// 90th percentile.
    pub p90: Option<u64>,
    /// 99th percentile.
    pub p99: Option<u64>,
    /// The largest.
    pub max: Option<u64>,
    /// Counts in `bins` equal spans from 0 to `max`.
    pub histogram: Vec<u64>,
}

impl Distribution {
    /// The distribution of `values`, with a histogram of `bins` spans.
    pub fn of(mut values: Vec<u64>, bins: usize) -> Self {
        values.sort_unstable();
        let Some(&max) = values.last() else {
            return Self::default();
        };
        let at = |q: f64| {
            let rank = ((values.len() as f64) * q).ceil() as usize;
            values[rank.clamp(1, values.len()) - 1]
        };
        let mut histogram = vec![0; bins.max(1)];
        let width = (max / histogram.len() as u64).max(1) + 1;
        for value in &values {
            let bin = ((value / width) as usize).min(histogram.len() - 1);
            histogram[bin] += 1;
        }
        Self {
            count: values.len() as u64,
            p50: Some(at(0.5)),
            p90: Some(at(0.9)),
            p99: Some(at(0.99)),
            max: Some(max),
            histogram,
        }
    }
}

/// A job's completions over its life and the latencies of its items.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobActivity {
    /// The span each bucket covers (ms).
    pub bucket_ms: i64,
    /// Completions per span, from the job's start to its end (or now).
    pub buckets: Vec<ActivityBucket>,
    /// Time to first token.
    pub first_token_ms: Distribution,
    /// Time from entering the engine to the last token.
    pub duration_ms: Distribution,
}

impl JobActivity {
    /// The activity of `job` from its completions, in at most `spans` buckets
    /// between its start and its end (or `now` while it runs).
    pub fn of(job: &Job, samples: &[CompletionSample], now: i64, spans: usize) -> Self {
        let t = &job.times;
        let start = t.in_progress_at.unwrap_or(t.created_at);
        let last = samples.iter().map(|s| s.completed_at).max();
        let end = [t.completed_at, t.failed_at, t.cancelled_at, t.expired_at]
            .into_iter()
            .flatten()
            .max()
            .filter(|_| job.state.is_terminal())
            .unwrap_or(now)
            .max(last.unwrap_or(start))
            .max(start + 1);
        let spans = spans.max(1) as i64;
        // Whole seconds per bucket: rates read as "per second" multiples.
        let per_span = (end - start + spans - 1) / spans;
        let bucket_ms = ((per_span + 999) / 1000).max(1) * 1000;
        let count = ((end - start) / bucket_ms + 1) as usize;
        let mut buckets: Vec<ActivityBucket> = (0..count)
            .map(|i| ActivityBucket {
                start: start + i as i64 * bucket_ms,
                completed: 0,
                tokens: 0,
            })
            .collect();
        for sample in samples {
            let i = ((sample.completed_at - start).max(0) / bucket_ms) as usize;
            let bucket = &mut buckets[i.min(count - 1)];
            bucket.completed += 1;
            bucket.tokens += sample.completion_tokens;
        }
        let latencies = |pick: fn(&CompletionSample) -> Option<u64>| {
            Distribution::of(samples.iter().filter_map(pick).collect(), 20)
        };
        Self {
            bucket_ms,
            buckets,
            first_token_ms: latencies(|s| s.first_token_ms),
            duration_ms: latencies(|s| s.duration_ms),
        }
    }
}

/// A worker process registered on the queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    /// Its registration id.
    pub id: i64,
    /// Its host (the name, without the boot id that tells boots apart).
    pub host: String,
    /// Its process id there.
    pub pid: u32,
    /// The model it runs (SHA-256), if it is bound to one.
    pub model_sha256: Option<String>,
    /// When it registered (Unix ms).
    pub registered_at: i64,
    /// When it last showed it is alive (Unix ms).
    pub heartbeat_at: Option<i64>,
    /// Items it has in flight.
    pub running: u64,
}

/// The host part of a host identity (`name/boot-id`).
pub fn host_name(identity: &str) -> &str {
    identity.split('/').next().unwrap_or(identity)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_and_histogram() {
        let d = Distribution::of((1..=100).collect(), 10);
        assert_eq!(
            (d.p50, d.p90, d.p99, d.max),
            (Some(50), Some(90), Some(99), Some(100))
        );
        assert_eq!(d.histogram.iter().sum::<u64>(), 100);
        assert_eq!(d.histogram.len(), 10);
        assert_eq!(Distribution::of(Vec::new(), 10), Distribution::default());
    }

    #[test]
    fn completions_fall_into_spans_from_the_start() {
        let mut job: Job = serde_json::from_value(serde_json::json!({
            "id": 1, "state": "in_progress", "source_name": "x", "source_sha256": "", "model": "m",
            "model_sha256": null, "defaults": {}, "metadata": {}, "project": "default", "priority": 0,
            "max_attempts": 3, "counts": {"total": 3, "pending": 0, "running": 0, "completed": 3,
            "failed": 0, "cancelled": 0, "invalid": 0}, "prompt_tokens": 0, "completion_tokens": 0,
            "times": {"created_at": 0, "in_progress_at": 10_000}
        }))
        .unwrap();
        let sample = |at, tokens| CompletionSample {
            completed_at: at,
            completion_tokens: tokens,
            first_token_ms: Some(5),
            duration_ms: Some(at as u64 / 100),
        };
        let samples = [sample(10_500, 4), sample(11_200, 6), sample(19_900, 1)];
        let activity = JobActivity::of(&job, &samples, 20_000, 10);
        assert_eq!(activity.bucket_ms, 1000);
        assert_eq!(activity.buckets[0].completed, 1);
        assert_eq!(activity.buckets[1].tokens, 6);
        assert_eq!(activity.buckets[9].completed, 1);
        assert_eq!(activity.first_token_ms.count, 3);
        job.state = crate::JobState::Completed;
        job.times.completed_at = Some(20_000);
        let later = JobActivity::of(&job, &samples, 90_000, 10);
        assert_eq!(
            later.buckets.len(),
            activity.buckets.len(),
            "an ended job's span stops at its end"
        );
    }

    #[test]
    fn hosts_are_named_without_their_boot_id() {
        assert_eq!(host_name("box/1234-abcd"), "box");
        assert_eq!(host_name("plain"), "plain");
    }
}
