//! Helpers shared by the queue's integration tests.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use cortex_openai::SubmitJsonl;
use cortex_queue::{ClaimedItem, JobId, Queue, SubmitOptions};
use cortex_queue_postgres::{PgConfig, PgStore};
use cortex_queue_sqlite::{Store, StoreConfig};
use cortex_request::{Completion, FinishReason, Response, Timings, Usage};

/// A JSONL file of `n` prompts alternating between the OpenAI chat format and plain completions.
pub fn write_prompts(dir: &Path, name: &str, n: usize) -> PathBuf {
    let mut text = String::new();
    for i in 0..n {
        if i % 2 == 0 {
            text.push_str(&format!(
                r#"{{"custom_id": "item-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {{"messages": [{{"role": "user", "content": "Question {i}?"}}], "max_tokens": 16}}}}"#
            ));
        } else {
            text.push_str(&format!(
                r#"{{"custom_id": "item-{i}", "prompt": "Story {i}:", "max_tokens": 16}}"#
            ));
        }
        text.push('\n');
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// What a worker would produce for `item` (deterministic, so duplicates would show).
pub fn response_for(item: &ClaimedItem) -> Response {
    Response {
        id: item.request.id(),
        completions: vec![Completion {
            index: 0,
            text: format!("answer to {}", item.custom_id),
            tokens: vec![1, 2, 3],
            finish_reason: FinishReason::Length,
            logprobs: None,
            prompt_logprobs: None,
            tool_calls: Vec::new(),
            reasoning: None,
        }],
        usage: Usage {
            prompt_tokens: 7,
            completion_tokens: 3,
            cached_prompt_tokens: 0,
        },
        timings: Timings::default(),
        embeddings: Vec::new(),
    }
}

/// A SQLite store with fast retries (and lone suspects retried at once),
/// for tests that exercise backoff and worker deaths.
pub fn open_fast(path: &Path) -> Store {
    let config = StoreConfig {
        retry_backoff: Duration::from_millis(50),
        max_retry_backoff: Duration::from_millis(200),
        lone_retry: Duration::ZERO,
        ..StoreConfig::default()
    };
    Store::open_with(path, config).unwrap()
}

/// Submits a job of `n` prompts (see [`write_prompts`]) with default options.
pub fn submit_prompts(store: &mut dyn Queue, dir: &Path, name: &str, n: usize) -> JobId {
    store
        .submit_file(&write_prompts(dir, name, n), &SubmitOptions::new("m"))
        .unwrap()
        .job
}

/// Retry and death timings a test wants of a store.
#[derive(Debug, Clone, Copy)]
pub struct RetryTimings {
    /// First retry delay of a failed item.
    pub retry_backoff: Duration,
    /// Longest retry delay.
    pub max_retry_backoff: Duration,
    /// Wait of a lone suspect whose worker died.
    pub lone_retry: Duration,
}

impl RetryTimings {
    /// Fast retries, lone suspects at once.
    pub const FAST: RetryTimings = RetryTimings {
        retry_backoff: Duration::from_millis(50),
        max_retry_backoff: Duration::from_millis(200),
        lone_retry: Duration::ZERO,
    };
    /// The stores' defaults.
    pub fn default_for_tests() -> RetryTimings {
        let d = StoreConfig::default();
        RetryTimings {
            retry_backoff: d.retry_backoff,
            max_retry_backoff: d.max_retry_backoff,
            lone_retry: d.lone_retry,
        }
    }
}

/// One queue driver under test: a SQLite file in a temporary directory,
/// or a fresh database on the PostgreSQL server `CORTEX_TEST_POSTGRES` names.
pub struct Driver {
    /// Scratch space (the SQLite file, inputs, exports).
    pub dir: tempfile::TempDir,
    /// The PostgreSQL database's URL; `None` for SQLite.
    pub url: Option<String>,
}

impl Driver {
    /// A SQLite file.
    pub fn sqlite() -> Driver {
        Driver {
            dir: tempfile::tempdir().unwrap(),
            url: None,
        }
    }

    /// A fresh PostgreSQL database, if a test server is configured.
    pub fn postgres(hint: &str) -> Option<Driver> {
        Some(Driver {
            url: Some(cortex_queue_postgres::testing::fresh_database(hint)?),
            dir: tempfile::tempdir().unwrap(),
        })
    }

    /// What another process opens this queue by: the SQLite file's path or the URL.
    pub fn location(&self) -> String {
        match &self.url {
            Some(url) => url.clone(),
            None => self.dir.path().join("q.db").display().to_string(),
        }
    }

    /// `sqlite` or `postgres`.
    pub fn name(&self) -> &'static str {
        if self.url.is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    /// The scratch directory.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A connection with default settings.
    pub fn open(&self) -> Box<dyn Queue> {
        self.open_timed(RetryTimings::default_for_tests())
    }

    /// A connection with fast retries (see [`open_fast`]).
    pub fn open_fast(&self) -> Box<dyn Queue> {
        self.open_timed(RetryTimings::FAST)
    }

    /// A connection with these retry timings.
    pub fn open_timed(&self, t: RetryTimings) -> Box<dyn Queue> {
        match &self.url {
            None => Box::new(
                Store::open_with(
                    self.dir.path().join("q.db"),
                    StoreConfig {
                        retry_backoff: t.retry_backoff,
                        max_retry_backoff: t.max_retry_backoff,
                        lone_retry: t.lone_retry,
                        ..StoreConfig::default()
                    },
                )
                .unwrap(),
            ),
            Some(url) => Box::new(
                PgStore::connect_with(
                    url,
                    PgConfig {
                        retry_backoff: t.retry_backoff,
                        max_retry_backoff: t.max_retry_backoff,
                        lone_retry: t.lone_retry,
                        ..PgConfig::default()
                    },
                )
                .unwrap(),
            ),
        }
    }

    /// The driver's own consistency check: SQLite's integrity and foreign
    /// keys; PostgreSQL's per-job counters against the items themselves.
    pub fn check(&self) {
        match &self.url {
            None => Store::open(self.dir.path().join("q.db"))
                .unwrap()
                .integrity_check()
                .unwrap(),
            Some(url) => PgStore::connect(url).unwrap().check_counts().unwrap(),
        }
    }
}

/// Runs each named test (a `fn(&Driver)`) on SQLite and on PostgreSQL.
#[macro_export]
macro_rules! on_both_drivers {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(#[test]
            fn $name() {
                super::$name(&$crate::queue_common::Driver::sqlite());
            })*
        }
        mod postgres {
            $(#[test]
            fn $name() {
                if let Some(driver) = $crate::queue_common::Driver::postgres(stringify!($name)) {
                    super::$name(&driver);
                }
            })*
        }
    };
}

/// Two numbers the driver's own SQL gives (`rusqlite` for SQLite, `psql`
/// for PostgreSQL): for tests that look at how data is stored.
pub fn sql_pair(b: &Driver, first: &str, second: &str) -> (i64, i64) {
    let one = |sql: &str| -> i64 {
        match &b.url {
            None => rusqlite::Connection::open(b.dir.path().join("q.db"))
                .unwrap()
                .query_row(sql, [], |row| row.get(0))
                .unwrap(),
            Some(url) => {
                let out = std::process::Command::new("psql")
                    .args([url.as_str(), "-qAt", "-c", sql])
                    .output()
                    .expect("psql runs");
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            }
        }
    };
    (one(first), one(second))
}

/// Opens the queue a `--db`-style value names (a child process's way in).
pub fn open_location(location: &str) -> Box<dyn Queue> {
    match cortex_queue::Database::parse(location) {
        cortex_queue::Database::Sqlite(path) => Box::new(Store::open(path).unwrap()),
        cortex_queue::Database::Postgres(url) => Box::new(PgStore::connect(&url).unwrap()),
    }
}
