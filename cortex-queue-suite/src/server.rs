//! For drivers on a database server (PostgreSQL): the test server the
//! environment names, and a fresh database name per case.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The test server's URL from the environment variable `url_var` (a URL
/// whose role may create databases), or `None` after saying so on stderr.
///
/// # Panics
///
/// When `require_var` is `1` and no server is named: a run that must test
/// the driver fails rather than skip it.
pub fn test_server(url_var: &str, require_var: &str) -> Option<String> {
    match std::env::var(url_var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var(require_var).as_deref() != Ok("1"),
                "{require_var}=1 but {url_var} is not set"
            );
            eprintln!("skipped: no database server (set {url_var} to a database URL)");
            None
        }
    }
}

/// A database name for one test, from `hint`, the process and a counter:
/// unique across the cases and the processes of a run.
pub fn fresh_database_name(hint: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "t_{}_{}_{}",
        hint.chars()
            .filter(char::is_ascii_alphanumeric)
            .take(24)
            .collect::<String>(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
    .to_lowercase()
}
