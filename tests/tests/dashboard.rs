//! The dashboard at `/` in a real browser: Debian's chromium, headless,
//! driven by Playwright for Python (`tests/python/dashboard.py`), against
//! `cortex serve` with the real model and real `cortex worker` processes.
//! Screenshots of every page land in `target/test-artifacts/dashboard/`.

use std::path::Path;

use cortex_tests::{Cortex, Server, python_check};

const KEY: &str = "dashboard-test-key";

/// Debian's chromium (scripts/install-build-tools.sh installs it).
fn chromium() -> &'static str {
    let path = "/usr/bin/chromium";
    assert!(
        Path::new(path).is_file(),
        "{path} is missing: `apt-get install chromium` (scripts/test.sh does)"
    );
    path
}

#[test]
fn the_dashboard_starts_watches_inspects_and_steers_jobs_in_a_browser() {
    let cortex = Cortex::new();
    // The servers work no batches themselves: the test's own workers do,
    // so it decides when items run.
    let server = Server::start(&cortex, &["--parallel", "8", "--batch-parallel", "0"]);
    let keyed = Server::start(
        &cortex,
        &["--parallel", "2", "--batch-parallel", "0", "--api-key", KEY],
    );
    let artifacts =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/test-artifacts/dashboard");
    std::fs::create_dir_all(&artifacts).unwrap();
    let settings = cortex.write(
        "dashboard.json",
        &serde_json::json!({
            "url": server.url(),
            "keyed_url": keyed.url(),
            "key": KEY,
            "chromium": chromium(),
            "artifacts": artifacts,
            "cortex": cortex.settings(),
        })
        .to_string(),
    );
    let printed = python_check("dashboard.py", &[&settings]);
    println!("{printed}");
    drop((server, keyed));
    cortex.check_store();
}
