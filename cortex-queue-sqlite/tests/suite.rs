//! The queue's shared driver suite (`cortex-queue-suite`) on SQLite: a
//! database file in a temporary directory per case. `cargo test -p
//! cortex-queue-sqlite` runs every case a driver must pass.

use std::path::Path;

use cortex_queue::{Queue, RetryPolicy};
use cortex_queue_sqlite::{Store, StoreConfig};
use cortex_queue_suite::DriverUnderTest;

/// A SQLite file in a directory of its own.
struct Sqlite {
    dir: tempfile::TempDir,
}

impl Sqlite {
    fn file(&self) -> std::path::PathBuf {
        self.dir.path().join("q.db")
    }
}

impl DriverUnderTest for Sqlite {
    fn fresh(_test: &str) -> Option<Sqlite> {
        Some(Sqlite {
            dir: tempfile::tempdir().unwrap(),
        })
    }

    fn open_location(location: &str) -> Box<dyn Queue> {
        Box::new(Store::open(location).unwrap())
    }

    fn scratch(&self) -> &Path {
        self.dir.path()
    }

    fn location(&self) -> String {
        self.file().display().to_string()
    }

    fn open_with(&self, retry: RetryPolicy) -> Box<dyn Queue> {
        let config = StoreConfig {
            retry,
            ..StoreConfig::default()
        };
        Box::new(Store::open_with(self.file(), config).unwrap())
    }

    /// SQLite's integrity check and foreign keys.
    fn check(&self) {
        Store::open(self.file()).unwrap().integrity_check().unwrap();
    }

    fn stored_grammars_and_longest_request(&self) -> (i64, i64) {
        let connection = rusqlite::Connection::open(self.file()).unwrap();
        let number =
            |sql: &str| -> i64 { connection.query_row(sql, [], |row| row.get(0)).unwrap() };
        (
            number("SELECT count(*) FROM grammars"),
            number("SELECT max(length(request)) FROM items"),
        )
    }
}

cortex_queue_suite::queue_suite!(Sqlite);
