//! `cortex serve --unix-socket PATH --unix-socket-only`: the same routes on
//! a Unix-domain socket only its owner can connect to (mode 0600), no TCP
//! port at all, reached by `curl --unix-socket` and the official `openai`
//! client over an httpx transport; the socket is gone after a clean stop.

use std::io::{Read, Write};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cortex_tests::{Cortex, free_port, python_check};

fn health(socket: &Path) -> Option<String> {
    let mut stream = UnixStream::connect(socket).ok()?;
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    Some(answer)
}

#[test]
fn a_unix_socket_serves_its_owner_only_and_no_port_is_opened() {
    let cortex = Cortex::new();
    let socket = cortex.dir().join("run").join("cortex.sock");
    std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
    // A socket left by a server that died is replaced.
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let port = free_port().to_string();
    let socket_text = socket.to_string_lossy().into_owned();
    let mut child = cortex.spawn(&[
        "serve",
        "--port",
        &port,
        "--unix-socket",
        &socket_text,
        "--unix-socket-only",
    ]);
    let started = Instant::now();
    while !health(&socket).is_some_and(|a| a.starts_with("HTTP/1.1 200")) {
        assert!(
            child.try_wait().unwrap().is_none(),
            "cortex serve exited before it was healthy"
        );
        assert!(started.elapsed() < Duration::from_secs(120), "not healthy");
        std::thread::sleep(Duration::from_millis(100));
    }
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "only its owner");
    // Nothing was left beside it by the way it was made.
    let beside: Vec<_> = std::fs::read_dir(socket.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside.len(), 1, "{beside:?}");
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_err(),
        "--unix-socket-only opened a TCP port"
    );
    // A second server on the same socket is refused, not handed the socket.
    let refusal = cortex.refused(
        &[
            "serve",
            "--port",
            &free_port().to_string(),
            "--unix-socket",
            &socket_text,
        ],
        &["a server is answering on it already"],
    );
    assert!(refusal.contains("cortex.sock"), "{refusal}");

    let curl = Command::new("curl")
        .args([
            "-sS",
            "--unix-socket",
            &socket_text,
            "http://localhost/v1/models",
        ])
        .output()
        .expect("curl runs (scripts/install-build-tools.sh installs it)");
    let listed = String::from_utf8_lossy(&curl.stdout);
    assert!(
        curl.status.success() && listed.contains("\"object\":\"list\""),
        "{listed}"
    );
    let printed = python_check("unix_socket.py", &[&socket]);
    assert!(printed.contains("ALL CHECKS PASSED"), "{printed}");

    let stopped = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    assert!(child.wait().unwrap().success());
    assert!(!socket.exists(), "the socket outlived its server");
}
