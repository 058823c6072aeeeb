//! Crash points for tests: `CORTEX_FAILPOINT=NAME` (or `NAME@N`, the N-th
//! time it is reached) makes the process kill itself with SIGKILL there, as
//! `kill -9` from outside would. Points: `claim` (inside the claim
//! transaction), `complete:written` (result written, not committed),
//! `complete:committed` (right after the commit).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms a failpoint.
pub(crate) const FAILPOINT_ENV: &str = "CORTEX_FAILPOINT";

fn armed() -> Option<&'static (String, u64)> {
    static ARMED: OnceLock<Option<(String, u64)>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = std::env::var(FAILPOINT_ENV).ok()?;
            match spec.split_once('@') {
                Some((name, nth)) => Some((name.to_owned(), nth.parse().unwrap_or(1))),
                None => Some((spec, 1)),
            }
        })
        .as_ref()
}

/// Dies here if this failpoint is armed and its turn has come.
pub(crate) fn hit(name: &str) {
    static HITS: AtomicU64 = AtomicU64::new(0);
    let Some((armed_name, nth)) = armed() else {
        return;
    };
    if armed_name != name || HITS.fetch_add(1, Ordering::SeqCst) + 1 != *nth {
        return;
    }
    eprintln!("failpoint {name}: killing process {}", std::process::id());
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    // SIGKILL is asynchronous; never run past the failpoint. (abort if `kill` is missing)
    std::thread::sleep(std::time::Duration::from_secs(5));
    std::process::abort();
}
