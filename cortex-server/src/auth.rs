//! API keys and projects: with keys configured, every route but `/health` and `/openapi.json`
//! needs `Authorization: Bearer KEY` (Ollama's routes too). Each key acts
//! for a project: the files, batches and prompt-prefix cache of one project
//! are not another's. An admin key sees every project's files and batches
//! (the CLI's jobs are the `default` project's); without keys the one user
//! is an admin of `default`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::AUTHORIZATION;
use axum::middleware::Next;
use axum::response::Response;
use cortex_queue::DEFAULT_PROJECT;
use cortex_request::CacheScope;

use crate::error::ApiError;

/// One API key: the project it acts for, and whether it sees every project.
/// `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey {
    /// What clients send as `Authorization: Bearer KEY`.
    pub key: String,
    /// The project its files, batches and requests belong to.
    pub project: String,
    /// Sees (lists, reads, cancels) every project's files and batches.
    pub admin: bool,
}

impl ApiKey {
    /// A key of the `default` project, with admin rights: what a key given
    /// without a project is (one user, every job theirs).
    pub fn admin(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            project: DEFAULT_PROJECT.to_owned(),
            admin: true,
        }
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey")
            .field("project", &self.project)
            .field("admin", &self.admin)
            .finish_non_exhaustive()
    }
}

/// API keys. `Debug` shows how many there are, never the keys, so a logged
/// configuration does not leak them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ApiKeys(pub Vec<ApiKey>);

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKeys({} keys)", self.0.len())
    }
}

impl std::ops::Deref for ApiKeys {
    type Target = [ApiKey];

    fn deref(&self) -> &[ApiKey] {
        &self.0
    }
}

/// Who sent a request: what the `auth` layer puts in every request's
/// extensions for the handlers.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// Which configured key (its position, for limits per key); `None` on a
    /// server without keys.
    pub(crate) key: Option<usize>,
    pub(crate) project: Arc<str>,
    pub(crate) admin: bool,
    /// Its project's part of the prompt-prefix cache.
    pub(crate) cache_scope: CacheScope,
}

impl Caller {
    fn new(key: Option<usize>, project: &str, admin: bool) -> Self {
        Self {
            key,
            project: project.into(),
            admin,
            cache_scope: CacheScope::named(project),
        }
    }

    /// The caller of a server without keys.
    fn keyless() -> Self {
        Self::new(None, DEFAULT_PROJECT, true)
    }

    /// The caller of each configured key, in order.
    pub(crate) fn of_keys(keys: &ApiKeys) -> Vec<Self> {
        keys.iter()
            .enumerate()
            .map(|(i, k)| Self::new(Some(i), &k.project, k.admin))
            .collect()
    }

    /// Whether objects of `project` are this caller's to see.
    pub(crate) fn sees(&self, project: &str) -> bool {
        self.admin || *self.project == *project
    }

    /// The project filter of this caller's listings (`None`: all of them).
    pub(crate) fn listing(&self) -> Option<String> {
        (!self.admin).then(|| self.project.to_string())
    }
}

/// Compares without stopping at the first differing byte, and with work
/// that depends only on what the client sent: the time taken says nothing
/// about how much of a key was right, nor how long the key is.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    if key.is_empty() {
        return false;
    }
    let mut difference = given.len() ^ key.len();
    for (i, byte) in given.iter().enumerate() {
        difference |= usize::from(byte ^ key[i % key.len()]);
    }
    difference == 0
}

/// Routes only an admin key may use when keys are configured: they tell
/// of every project at once, or change the server's models.
fn needs_admin(path: &str) -> bool {
    matches!(
        path,
        "/metrics" | "/v1/metrics" | "/api/pull" | "/api/create" | "/api/copy" | "/api/delete"
    ) || path.starts_with("/api/blobs/")
}

/// Routes that need no key: up or down, the API's description, and the
/// dashboard's page (which holds no data: it asks for a key to read any).
fn is_open(path: &str) -> bool {
    path == "/health" || path == crate::openapi::ROUTE || crate::dashboard::ROUTES.contains(&path)
}

/// What the key check needs: the configured keys and who each one is.
pub(crate) struct KeyCheck {
    keys: ApiKeys,
    callers: Vec<Caller>,
}

impl KeyCheck {
    pub(crate) fn new(keys: &ApiKeys) -> Arc<Self> {
        Arc::new(Self {
            keys: keys.clone(),
            callers: Caller::of_keys(keys),
        })
    }
}

/// The middleware of every route: finds the caller of the request's key
/// (the keyless caller when the server has no keys, or on an open route).
pub(crate) async fn require_key(
    State(check): State<Arc<KeyCheck>>,
    mut request: Request,
    next: Next,
) -> Response {
    let keys = &check.keys;
    if keys.is_empty() || is_open(request.uri().path()) {
        request.extensions_mut().insert(Caller::keyless());
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    let path = request.uri().path();
    let refusal = match given {
        None => "no API key: send `Authorization: Bearer KEY`",
        Some(value) => match value.strip_prefix("Bearer ") {
            Some(token) => {
                // Every key is compared, so the time says nothing of which matched.
                let token = token.trim().as_bytes();
                let matched = keys.iter().enumerate().fold(None, |found, (i, k)| {
                    if same_key(token, k.key.as_bytes()) {
                        Some(i)
                    } else {
                        found
                    }
                });
                match matched {
                    Some(index) if keys[index].admin || !needs_admin(path) => {
                        let caller = check.callers[index].clone();
                        request.extensions_mut().insert(caller);
                        return next.run(request).await;
                    }
                    Some(_) => {
                        return ApiError::refused(
                            StatusCode::FORBIDDEN,
                            format!(
                                "{path} tells of every project or changes the server's models: it needs an admin key"
                            ),
                        )
                        .for_path(path);
                    }
                    None => "the API key is not one this server accepts",
                }
            }
            None => "the Authorization header must be `Bearer KEY`",
        },
    };
    ApiError::unauthorized(refusal).for_path(path)
}

#[cfg(test)]
mod tests {
    use super::{ApiKey, ApiKeys, same_key};

    #[test]
    fn keys_compare_whole() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secret", b"secreT"));
        assert!(!same_key(b"secre", b"secret"));
        assert!(!same_key(b"secretsecret", b"secret"));
        assert!(!same_key(b"", b"secret"));
        assert!(!same_key(b"", b""));
    }

    #[test]
    fn keys_never_show_in_debug() {
        let keys = ApiKeys(vec![
            ApiKey::admin("s3cret"),
            ApiKey {
                key: "other".into(),
                project: "alpha".into(),
                admin: false,
            },
        ]);
        let shown = format!("{keys:?} {:?}", keys[1]);
        assert_eq!(
            shown,
            r#"ApiKeys(2 keys) ApiKey { project: "alpha", admin: false, .. }"#
        );
        assert_eq!(keys.len(), 2);
    }
}
