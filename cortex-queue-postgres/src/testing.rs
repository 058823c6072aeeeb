//! For test suites that run on a real PostgreSQL server: the server named by
//! `CORTEX_TEST_POSTGRES` (a URL whose role may create databases), and a
//! fresh database on it per test. Without the variable a test is skipped
//! (saying so), unless `CORTEX_REQUIRE_POSTGRES=1` (as `scripts/test.sh`
//! sets), which makes its absence a failure.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::PgStore;

/// The test server's URL, or `None` after saying so on stderr.
///
/// # Panics
///
/// When `CORTEX_REQUIRE_POSTGRES=1` and no server is named.
pub fn server() -> Option<String> {
    match std::env::var("CORTEX_TEST_POSTGRES") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CORTEX_REQUIRE_POSTGRES").as_deref() != Ok("1"),
                "CORTEX_REQUIRE_POSTGRES=1 but CORTEX_TEST_POSTGRES is not set"
            );
            eprintln!("skipped: no PostgreSQL server (set CORTEX_TEST_POSTGRES to a database URL)");
            None
        }
    }
}

/// A new, empty database on the test server, named after `hint`, the
/// process and a counter; its URL. `None` as [`server`].
///
/// # Panics
///
/// When the database cannot be created.
pub fn fresh_database(hint: &str) -> Option<String> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let server = server()?;
    let name = format!(
        "t_{}_{}_{}",
        hint.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(24)
            .collect::<String>(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
    .to_lowercase();
    Some(PgStore::create_database(&server, &name).expect("create a test database"))
}
