//! An S3-compatible server on loopback for the object-store tests: s3s-fs
//! (`scripts/s3-server.sh` builds it; `scripts/test.sh` passes it as
//! `CORTEX_TEST_S3_SERVER`) over a temporary folder, killed on drop.

use std::io::{Read, Seek, SeekFrom};
use std::net::{Ipv4Addr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Cortex, free_port, python_check, service_program};

/// The access key and secret the server takes.
const ACCESS_KEY: &str = "cortex-test";
const SECRET_KEY: &str = "cortex-test-secret";

/// A running s3s-fs with one bucket, `data`.
pub struct S3Server {
    child: Child,
    root: tempfile::TempDir,
    port: u16,
}

impl S3Server {
    /// Starts one; `None`, after saying so, when no server binary was given
    /// and none is required (`CORTEX_REQUIRE_S3=1`).
    pub fn start() -> Option<Self> {
        Self::launch(true)
    }

    /// Starts one that takes requests without credentials: its objects are
    /// plain `http://` URLs (with ranges and ETags), as a web server's.
    pub fn start_anonymous() -> Option<Self> {
        Self::launch(false)
    }

    fn launch(with_keys: bool) -> Option<Self> {
        let binary = service_program(
            "S3 server",
            "CORTEX_TEST_S3_SERVER",
            "CORTEX_REQUIRE_S3",
            "bash scripts/s3-server.sh builds one",
        )?;
        let root = tempfile::tempdir().expect("a temp dir");
        std::fs::create_dir(root.path().join("data")).expect("the bucket's folder");
        let (child, port) = start_listening("s3s-fs", |port| {
            let mut command = Command::new(&binary);
            command.args(["--host", "127.0.0.1", "--port", &port.to_string()]);
            if with_keys {
                command.args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY]);
            }
            command.arg(root.path());
            command
        });
        Some(Self { child, root, port })
    }

    /// The endpoint (`AWS_ENDPOINT_URL`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The `AWS_*` variables a client of this server needs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_DEFAULT_REGION", "us-east-1".into()),
        ]
    }

    /// Points an installation's commands at this server.
    pub fn configure(&self, cortex: &mut Cortex) {
        for (name, value) in self.env() {
            cortex.set_env(name, &value);
        }
    }

    /// The folder behind the server.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// Runs `tests/python/s3_objects.py` (boto3) against this server.
    pub fn boto3(&self, args: &[&str]) -> String {
        let keys = format!("{ACCESS_KEY}:{SECRET_KEY}");
        let endpoint = self.endpoint();
        let mut all = vec!["--endpoint", &endpoint, "--keys", &keys];
        all.extend_from_slice(args);
        let paths: Vec<&Path> = all.iter().map(Path::new).collect();
        python_check("s3_objects.py", &paths)
    }

    /// The bucket's keys and sizes, as boto3 lists them.
    pub fn list(&self) -> Vec<(String, u64)> {
        self.boto3(&["list", "data"])
            .lines()
            .map(|line| {
                let item: serde_json::Value = serde_json::from_str(line).unwrap();
                (
                    item["key"].as_str().unwrap().to_owned(),
                    item["size"].as_u64().unwrap(),
                )
            })
            .collect()
    }
}

/// Starts a loopback server on a free port, built by `command` for that
/// port, and waits until it takes connections: up to 60 s, since a first
/// start of node's Azurite beside a test run on two busy cores has taken
/// over 20. A server that exits first (most often because another process
/// took the port between its choice and the server's bind) is started again
/// on another port, three tries in all; a failure says what it printed.
pub(crate) fn start_listening(what: &str, mut command: impl FnMut(u16) -> Command) -> (Child, u16) {
    const TRIES: usize = 3;
    for attempt in 1..=TRIES {
        let port = free_port();
        let mut log = tempfile::tempfile().expect("a log file");
        let mut child = command(port)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("the log's handle"))
            .stderr(log.try_clone().expect("the log's handle"))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let started = Instant::now();
        loop {
            if TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok() {
                return (child, port);
            }
            if let Ok(Some(status)) = child.try_wait() {
                let printed = read_log(&mut log);
                assert!(
                    attempt < TRIES,
                    "{what} exited ({status}) before listening on {port}:\n{printed}"
                );
                eprintln!(
                    "{what} exited ({status}) before listening on {port}; again on another port"
                );
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{what} did not listen on {port} in 60 s; it printed:\n{}",
                    read_log(&mut log)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    unreachable!("the last try returns or panics")
}

fn read_log(log: &mut std::fs::File) -> String {
    let mut printed = String::new();
    let _ = log.seek(SeekFrom::Start(0));
    let _ = log.read_to_string(&mut printed);
    printed
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
