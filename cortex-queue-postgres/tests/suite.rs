//! The queue's shared driver suite (`cortex-queue-suite`) on PostgreSQL: a
//! fresh database per case on the server `CORTEX_TEST_POSTGRES` names (the
//! cases pass without running when none is configured, unless
//! `CORTEX_REQUIRE_POSTGRES` is set). `CORTEX_TEST_POSTGRES=URL cargo test
//! -p cortex-queue-postgres` runs every case a driver must pass.

use std::path::Path;

use cortex_queue::{Queue, RetryPolicy};
use cortex_queue_postgres::{PgConfig, PgStore};
use cortex_queue_suite::{DriverUnderTest, fresh_database_name, test_server};

/// The test server `CORTEX_TEST_POSTGRES` names (`scripts/test.sh` starts
/// one); skipped without one unless `CORTEX_REQUIRE_POSTGRES=1`.
fn fresh_database(test: &str) -> Option<String> {
    let server = test_server("CORTEX_TEST_POSTGRES", "CORTEX_REQUIRE_POSTGRES")?;
    Some(
        PgStore::create_database(&server, &fresh_database_name(test))
            .expect("create a test database"),
    )
}

/// A database of its own, and a scratch directory for files.
struct Postgres {
    url: String,
    dir: tempfile::TempDir,
}

impl DriverUnderTest for Postgres {
    fn fresh(test: &str) -> Option<Postgres> {
        Some(Postgres {
            url: fresh_database(test)?,
            dir: tempfile::tempdir().unwrap(),
        })
    }

    fn open_location(location: &str) -> Box<dyn Queue> {
        Box::new(PgStore::connect(location).unwrap())
    }

    fn scratch(&self) -> &Path {
        self.dir.path()
    }

    fn location(&self) -> String {
        self.url.clone()
    }

    fn open_with(&self, retry: RetryPolicy) -> Box<dyn Queue> {
        let config = PgConfig {
            retry,
            ..PgConfig::default()
        };
        Box::new(PgStore::connect_with(&self.url, config).unwrap())
    }

    /// The per-job counters against the items themselves.
    fn check(&self) {
        PgStore::connect(&self.url).unwrap().check_counts().unwrap();
    }

    /// Asked with `psql`, apart from the driver's own client.
    fn stored_grammars_and_longest_request(&self) -> (i64, i64) {
        let number = |sql: &str| -> i64 {
            let out = std::process::Command::new("psql")
                .args([self.url.as_str(), "-qAt", "-c", sql])
                .output()
                .expect("psql runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
        };
        (
            number("SELECT count(*) FROM grammars"),
            number("SELECT max(length(request)) FROM items"),
        )
    }
}

cortex_queue_suite::queue_suite!(Postgres);
