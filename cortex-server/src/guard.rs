//! What a web page in the user's browser must not be able to do to a local
//! server: reach it under a foreign name (DNS rebinding: `Host` must be an
//! IP address, `localhost`, this machine's name or an allowed name), call
//! it from a foreign origin (`Origin` must be a loopback page, the server's
//! own, or an allowed one), or post a body a form can send without a
//! preflight (bodies must say `application/json`, or, from no web page,
//! nothing at all; uploads `multipart/form-data`). Allowed origins get
//! CORS answers.

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::ApiError;
use crate::listen::OverUnixSocket;

/// This machine's name, as other machines on its network may call it.
fn machine_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|name| name.trim().to_ascii_lowercase())
            .unwrap_or_default()
    })
}

/// The name in a `Host` value or an origin's authority, without the port.
fn host_name(authority: &str) -> &str {
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(name, port)| {
            if port.bytes().all(|b| b.is_ascii_digit()) {
                name
            } else {
                authority
            }
        })
}

fn is_loopback_name(name: &str) -> bool {
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

fn listed(list: &[String], value: &str) -> bool {
    list.iter()
        .any(|allowed| allowed == "*" || allowed.eq_ignore_ascii_case(value))
}

/// Whether `Host: host` names this server rather than someone else's domain.
fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let name = host_name(host).to_ascii_lowercase();
    name.parse::<IpAddr>().is_ok()
        || is_loopback_name(&name)
        || (!name.is_empty() && name == machine_name())
        || listed(allowed, &name)
}

/// Whether a browser page from `origin` may call the server reached as `host`.
fn origin_allowed(origin: &str, host: Option<&str>, allowed: &[String]) -> bool {
    if listed(allowed, origin) {
        return true;
    }
    let Some((scheme, authority)) = origin.split_once("://") else {
        return false; // `null`: a sandboxed page or a file
    };
    matches!(scheme, "http" | "https")
        && (is_loopback_name(&host_name(authority).to_ascii_lowercase())
            || host.is_some_and(|host| host.eq_ignore_ascii_case(authority)))
}

/// Whether a request carries a body (a length above zero, or chunks).
fn has_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// The media type a body to `path` must have, if it is not that. A JSON
/// body is taken whatever type it is labelled with (`curl -d` labels it a
/// form, as in Ollama's own API docs; LiteLLM's Ollama providers send none;
/// Ollama takes both): this runs only for requests that no web page sent
/// (every browser names the page a POST comes from in `Origin`) or that an
/// allowed page sent, which may send JSON anyway; any other page was
/// refused by its origin before. Uploads and blobs must say what they are.
fn wrong_body_type(
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    from_a_page: bool,
) -> Option<String> {
    if !matches!(*method, Method::POST | Method::PUT | Method::PATCH) || !has_body(headers) {
        return None;
    }
    if !from_a_page && !headers.contains_key(header::CONTENT_TYPE) {
        return None;
    }
    let expected = if path == crate::files::ROUTE {
        "multipart/form-data"
    } else if path.starts_with(crate::ollama::BLOBS_PREFIX) {
        "application/octet-stream"
    } else {
        return None;
    };
    let given = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // Ollama's client labels a blob's bytes with its JSON default (other
    // clients send none); a web page cannot send that JSON label, nor get
    // past the `Origin` check, from another origin.
    let media = given.split(';').next().unwrap_or("").trim();
    if expected == "application/octet-stream"
        && (given.is_empty() || media.eq_ignore_ascii_case("application/json"))
    {
        return None;
    }
    let media_type = given.split(';').next().unwrap_or("").trim();
    if media_type.eq_ignore_ascii_case(expected) {
        return None;
    }
    let given = if given.is_empty() { "none" } else { given };
    Some(format!(
        "a request body to {path} must be sent with `Content-Type: {expected}` (it was {given})"
    ))
}

/// The names and web origins a request may come under
/// (`allowed_hosts`, `allowed_origins`).
pub(crate) struct Allowed {
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
}

impl Allowed {
    pub(crate) fn new(config: &crate::ServerConfig) -> Arc<Self> {
        Arc::new(Self {
            allowed_hosts: config.allowed_hosts.clone(),
            allowed_origins: config.allowed_origins.clone(),
        })
    }
}

pub(crate) async fn guard(
    State(config): State<Arc<Allowed>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let headers = request.headers();
    let host = match headers.get(header::HOST).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(host)) => Some(host),
        Some(Err(_)) => {
            return ApiError::refused(StatusCode::BAD_REQUEST, "the Host header is not text")
                .for_path(&path);
        }
    };
    let over_unix_socket = request.extensions().get::<OverUnixSocket>().is_some();
    if let Some(host) = host
        && !over_unix_socket
        && !host_allowed(host, &config.allowed_hosts)
    {
        return ApiError::refused(
            StatusCode::FORBIDDEN,
            format!(
                "`Host: {host}` is not a name of this server: use its address, or start it with --allowed-hosts {}",
                host_name(host)
            ),
        )
        .for_path(&path);
    }
    let origin = match headers.get(header::ORIGIN).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(origin)) if origin_allowed(origin, host, &config.allowed_origins) => {
            Some(origin.to_owned())
        }
        Some(origin) => {
            let origin = origin.unwrap_or("(not text)");
            return ApiError::refused(
                StatusCode::FORBIDDEN,
                format!(
                    "requests from web pages at {origin} are not allowed: start cortex serve with --allowed-origins {origin} to allow them"
                ),
            )
            .for_path(&path);
        }
    };
    if let Some(origin) = &origin
        && request.method() == Method::OPTIONS
    {
        return preflight(origin, headers);
    }
    let from_a_page = headers.contains_key(header::ORIGIN);
    if let Some(message) = wrong_body_type(request.method(), &path, headers, from_a_page) {
        return ApiError::refused(StatusCode::UNSUPPORTED_MEDIA_TYPE, message).for_path(&path);
    }
    let mut response = next.run(request).await;
    if let Some(origin) = origin
        && let Ok(value) = HeaderValue::from_str(&origin)
    {
        let headers = response.headers_mut();
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
        headers.append(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

/// The answer to a CORS preflight from an allowed origin.
fn preflight(origin: &str, headers: &HeaderMap) -> Response {
    let mut response = StatusCode::NO_CONTENT.into_response();
    let out = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(origin) {
        out.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    out.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, DELETE, OPTIONS"),
    );
    let asked = headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
    out.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, asked);
    out.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    out.append(header::VARY, HeaderValue::from_static("Origin"));
    response
}

#[cfg(test)]
mod tests {
    use super::{host_allowed, host_name, origin_allowed};

    #[test]
    fn hosts_that_name_this_server_pass_and_others_do_not() {
        let none: Vec<String> = Vec::new();
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "[::1]:8080",
            "10.1.2.3",
            "LOCALHOST",
        ] {
            assert!(host_allowed(host, &none), "{host}");
        }
        for host in [
            "attacker.example:8080",
            "example.com",
            "127.0.0.1.nip.example",
        ] {
            assert!(!host_allowed(host, &none), "{host}");
        }
        assert!(host_allowed("gpu-box:8080", &["gpu-box".into()]));
        assert!(host_allowed("anything", &["*".into()]));
        assert_eq!(host_name("[::1]:80"), "::1");
    }

    #[test]
    fn origins_from_loopback_pages_and_the_server_itself_pass() {
        let none: Vec<String> = Vec::new();
        assert!(origin_allowed("http://localhost:3000", None, &none));
        assert!(origin_allowed("http://127.0.0.1:5173", None, &none));
        assert!(origin_allowed(
            "http://gpu-box:8080",
            Some("gpu-box:8080"),
            &none
        ));
        assert!(!origin_allowed(
            "https://evil.example",
            Some("127.0.0.1:8080"),
            &none
        ));
        assert!(!origin_allowed("null", Some("127.0.0.1:8080"), &none));
        assert!(origin_allowed(
            "https://app.example",
            None,
            &["https://app.example".into()]
        ));
    }
}
