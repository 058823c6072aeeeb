//! `cortex serve` in the background for a test: a free loopback port, a
//! wait until `/health` answers, plain HTTP requests for the harness's own
//! checks, and a kill when dropped.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

use crate::Cortex;

/// A running `cortex serve`.
pub struct Server {
    /// The process.
    pub child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// One HTTP/1.1 request on 127.0.0.1:`port`: the status and the body
/// (`None` when nothing answers).
pub fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .ok()?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Some((status, body))
}

/// Sends `request` (a whole HTTP/1.1 request, headers and body; any bytes)
/// to 127.0.0.1:`port` and reads the answer until the server closes the
/// connection: the status and the whole answer, headers included.
pub fn raw_http(port: u16, request: impl AsRef<[u8]>) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .ok()?;
    stream.write_all(request.as_ref()).ok()?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).ok()?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text.split(' ').nth(1)?.parse().ok()?;
    Some((status, text))
}

impl Server {
    /// Starts `cortex serve` with `args` on a free port and waits (up to two
    /// minutes: the first start may fetch the model) until `/health` says ok.
    pub fn start(cortex: &Cortex, args: &[&str]) -> Self {
        let port = free_port();
        let port_text = port.to_string();
        let mut all = vec!["serve", "--port", &port_text];
        all.extend_from_slice(args);
        let mut child = cortex.spawn(&all);
        let started = Instant::now();
        loop {
            if let Some((200, _)) = http(port, "GET", "/health", "") {
                return Self { child, port };
            }
            if let Ok(Some(status)) = child.try_wait() {
                let mut stderr = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut stderr);
                }
                panic!("cortex serve exited ({status}) before it was healthy: {stderr}");
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "cortex serve was not healthy within two minutes"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Sends `signal` (a `kill` name such as `TERM` or `KILL`).
    pub fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .args([format!("-{signal}"), self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -{signal} failed");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
