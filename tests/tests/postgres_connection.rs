//! The connection's failures, against a real PostgreSQL server
//! (`CORTEX_TEST_POSTGRES`; `scripts/test.sh` starts one): each is a one-line
//! error naming the database, and a connection lost mid-use comes back.

use std::process::Command;

use cortex_queue::{JobFilter, JobStore, QueueError};
use cortex_queue_postgres::{PgStore, SCHEMA_VERSION};

fn fresh(name: &str) -> Option<String> {
    cortex_tests::fresh_postgres(&format!("conn_{name}"))
}

/// Runs SQL with `psql` (PostgreSQL's own client), as an operator would.
fn psql(url: &str, sql: &str) {
    let status = Command::new("psql")
        .args([url, "-qAt", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGOPTIONS", "-c client_min_messages=warning")
        .status()
        .expect("psql runs");
    assert!(status.success(), "psql: {sql}");
}

#[test]
fn a_database_from_a_newer_cortex_is_refused() {
    let Some(url) = fresh("newer") else { return };
    assert_eq!(
        PgStore::connect(&url).unwrap().schema_version().unwrap(),
        SCHEMA_VERSION
    );
    psql(&url, "UPDATE cortex_schema SET version = 99");
    let error = PgStore::connect(&url).unwrap_err();
    assert!(
        matches!(error, QueueError::NewerSchema { found: 99, .. }),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains(&format!(
            "has schema version 99; this cortex knows up to {SCHEMA_VERSION}"
        )) && !message.contains('\n'),
        "{message}"
    );
}

#[test]
fn a_wrong_password_or_an_unreachable_server_is_a_one_line_error_without_the_password() {
    let Some(url) = fresh("auth") else { return };
    let wrong = url.replacen("://cortex:cortex@", "://cortex:not-the-password@", 1);
    assert_ne!(
        wrong, url,
        "the test server's URL has the cortex:cortex login"
    );
    let error = PgStore::connect(&wrong).unwrap_err().to_string();
    assert!(
        error.contains("password authentication failed for user \"cortex\"")
            && error.contains("cortex:***@")
            && !error.contains("not-the-password")
            && !error.contains('\n'),
        "{error}"
    );
    let error = PgStore::connect("postgres://cortex@127.0.0.1:1/cortex")
        .unwrap_err()
        .to_string();
    assert!(
        error.starts_with("cannot open the job database postgres://cortex@127.0.0.1:1/cortex: ")
            && error.contains("refused")
            && !error.contains('\n'),
        "{error}"
    );
}

#[test]
fn a_connection_killed_by_the_server_is_reconnected_on_the_next_call() {
    let Some(url) = fresh("killed") else { return };
    let mut store = PgStore::connect(&url).unwrap();
    assert!(store.jobs(&JobFilter::default()).unwrap().is_empty());
    // An administrator (or a failover) ends every connection to the database.
    psql(
        &url,
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    );
    assert!(store.jobs(&JobFilter::default()).unwrap().is_empty());
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

/// The test server's TLS certificates: `scripts/postgres.sh` makes them in
/// its directory (`CORTEX_TEST_POSTGRES_DIR`), with a role `cortex_tls`
/// that may connect over TLS only.
fn tls_certificates() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("CORTEX_TEST_POSTGRES_DIR")
        .map(|dir| std::path::Path::new(&dir).join("tls"))
        .filter(|dir| dir.join("server.crt").is_file());
    assert!(
        dir.is_some() || std::env::var("CORTEX_REQUIRE_POSTGRES").as_deref() != Ok("1"),
        "CORTEX_REQUIRE_POSTGRES=1 but CORTEX_TEST_POSTGRES_DIR has no tls/server.crt"
    );
    dir
}

#[test]
fn tls_is_used_and_checked_as_sslmode_says() {
    let (Some(server), Some(certs)) = (cortex_tests::postgres_server(), tls_certificates()) else {
        return;
    };
    let tls_only = server.replacen("://cortex:", "://cortex_tls:", 1);
    let with = |query: &str| format!("{tls_only}?{query}");
    let name = format!("t_tls_{}", std::process::id());

    // The role may not connect in the clear: the server says so.
    let plain = PgStore::create_database(&with("sslmode=disable"), &name).unwrap_err();
    assert!(plain.to_string().contains("no encryption"), "{plain}");

    // `require`: encrypted, the self-signed certificate not checked.
    let url = PgStore::create_database(&with("sslmode=require"), &name).unwrap();
    assert!(url.ends_with("?sslmode=require"), "{url}");
    let mut store = PgStore::connect(&url).unwrap();
    assert!(store.jobs(&JobFilter::default()).unwrap().is_empty());

    // `verify-full` against the certificate that signed it: connects.
    let database = url.trim_end_matches("?sslmode=require");
    let root = certs.join("server.crt");
    let verified = format!(
        "{database}?sslmode=verify-full&sslrootcert={}",
        root.display()
    );
    PgStore::connect(&verified).unwrap();
    let by_ca = format!(
        "{database}?sslmode=verify-ca&sslrootcert={}",
        root.display()
    );
    PgStore::connect(&by_ca).unwrap();

    // Against a root that signed nothing here: refused, saying why.
    let other = certs.join("other.crt");
    let forged = format!(
        "{database}?sslmode=verify-full&sslrootcert={}",
        other.display()
    );
    let error = PgStore::connect(&forged).unwrap_err().to_string();
    assert!(error.contains("certificate verify failed"), "{error}");
    assert!(!error.contains('\n'), "{error}");

    // A mode libpq does not know is named.
    let error = PgStore::connect(&format!("{database}?sslmode=always"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("sslmode=always"), "{error}");
}
