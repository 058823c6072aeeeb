//! The dashboard at `/`: one HTML page, its script and its style sheet,
//! embedded in the binary (no build step, nothing fetched from elsewhere).
//! The page holds no data: it reads the JSON API with the caller's key, so
//! these three routes are open while every route they call checks the key.

use axum::http::header;
use axum::response::{IntoResponse, Response};

/// The page's routes, open without a key.
pub(crate) const ROUTES: [&str; 3] = ["/", "/dashboard.js", "/dashboard.css"];

const PAGE: &str = include_str!("dashboard/index.html");
const SCRIPT: &str = include_str!("dashboard/dashboard.js");
const STYLE: &str = include_str!("dashboard/dashboard.css");

/// Nothing but this server's own files runs or loads in the page.
const POLICY: &str = "default-src 'self'; img-src 'self' data: blob:; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'";

fn asset(content_type: &'static str, text: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        text,
    )
        .into_response()
}

pub(crate) async fn page() -> Response {
    asset("text/html; charset=utf-8", PAGE)
}

pub(crate) async fn script() -> Response {
    asset("text/javascript; charset=utf-8", SCRIPT)
}

pub(crate) async fn style() -> Response {
    asset("text/css; charset=utf-8", STYLE)
}
