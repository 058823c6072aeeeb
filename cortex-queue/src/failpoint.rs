//! Crash points for tests, compiled in only with the `failpoints` feature
//! (the test build turns it on; release builds never have it):
//! `CORTEX_FAILPOINT=NAME` (or `NAME@N`, the N-th time it is reached) makes
//! the process kill itself with SIGKILL there, as `kill -9` from outside
//! would. Points of the queue: `claim` (inside the claim transaction),
//! `complete:written` (result written, not committed), `complete:committed`
//! (right after the commit). Other crates add their own through [`hit`],
//! e.g. the worker's `generated:CUSTOM_ID`.

/// The environment variable that arms a failpoint.
pub const FAILPOINT_ENV: &str = "CORTEX_FAILPOINT";

/// Whether this build has failpoints at all.
pub const ENABLED: bool = cfg!(feature = "failpoints");

/// Dies here if the failpoint `name` (with `detail` after a colon, when not
/// empty) is armed and its turn has come. Without the `failpoints` feature
/// this does nothing.
#[inline]
pub fn hit(name: &str, detail: &str) {
    #[cfg(feature = "failpoints")]
    armed::hit(name, detail);
    #[cfg(not(feature = "failpoints"))]
    let _ = (name, detail);
}

#[cfg(feature = "failpoints")]
mod armed {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};

    fn armed() -> Option<&'static (String, u64)> {
        static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
        ARMED
            .get_or_init(|| {
                let spec = std::env::var(super::FAILPOINT_ENV).ok()?;
                match spec.rsplit_once('@') {
                    Some((name, nth)) => Some((name.to_owned(), nth.parse().unwrap_or(1))),
                    None => Some((spec, 1)),
                }
            })
            .as_ref()
    }

    fn matches(armed: &str, name: &str, detail: &str) -> bool {
        if detail.is_empty() {
            return armed == name;
        }
        armed.len() == name.len() + 1 + detail.len()
            && armed.starts_with(name)
            && armed[name.len()..].starts_with(':')
            && armed.ends_with(detail)
    }

    pub(super) fn hit(name: &str, detail: &str) {
        static HITS: AtomicU64 = AtomicU64::new(0);
        let Some((armed_name, nth)) = armed() else {
            return;
        };
        if !matches(armed_name, name, detail) || HITS.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
            return;
        }
        eprintln!(
            "failpoint {armed_name}: killing process {}",
            std::process::id()
        );
        let pid = std::process::id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        // SIGKILL is asynchronous; never run past the failpoint. (abort if `kill` is missing)
        std::thread::sleep(std::time::Duration::from_secs(5));
        std::process::abort();
    }
}
