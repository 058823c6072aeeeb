//! What can go wrong with an object, said with its URL.

use std::io;

/// An object store's failure, naming the object.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    /// The URL is not one cortex can read or write.
    #[error("{url}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No object at the URL.
    #[error("{url}: no such object")]
    NotFound {
        /// The object.
        url: String,
    },
    /// The store refused the credentials.
    #[error(
        "{url}: the store refused access ({detail}); check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for s3://)"
    )]
    Denied {
        /// The object.
        url: String,
        /// The store's words.
        detail: String,
    },
    /// The object was replaced while it was read.
    #[error(
        "{url} changed while it was being read (its ETag was {etag}); nothing read from it was kept, run the command again to read the new version"
    )]
    Changed {
        /// The object.
        url: String,
        /// The ETag (or version) first seen.
        etag: String,
    },
    /// A store that can only be read was asked to write.
    #[error("{url}: {scheme}:// can only be read; write to a local path, s3://, gs:// or az://")]
    ReadOnly {
        /// The object.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// Anything else the store or the network said.
    #[error("{url}: {detail}")]
    Store {
        /// The object.
        url: String,
        /// The store's words.
        detail: String,
    },
}

impl ObjectError {
    pub(crate) fn from_store(url: &str, etag: Option<&str>, error: object_store::Error) -> Self {
        let url = url.to_owned();
        match error {
            object_store::Error::NotFound { .. } => Self::NotFound { url },
            object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
                Self::Changed {
                    url,
                    etag: etag.unwrap_or("unknown").to_owned(),
                }
            }
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => Self::Denied {
                url,
                detail: source.to_string(),
            },
            other => Self::Store {
                url,
                detail: chain(&other),
            },
        }
    }
}

/// An error and its sources in one line (a connection refused is in the
/// source of the source).
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let line = cause.to_string();
        if !text.contains(&line) {
            text.push_str(": ");
            text.push_str(&line);
        }
        source = cause.source();
    }
    text
}

impl From<ObjectError> for io::Error {
    fn from(error: ObjectError) -> Self {
        let kind = match &error {
            ObjectError::NotFound { .. } => io::ErrorKind::NotFound,
            ObjectError::Denied { .. } => io::ErrorKind::PermissionDenied,
            ObjectError::BadUrl { .. } | ObjectError::ReadOnly { .. } => {
                io::ErrorKind::InvalidInput
            }
            ObjectError::Changed { .. } => io::ErrorKind::InvalidData,
            ObjectError::Store { .. } => io::ErrorKind::Other,
        };
        io::Error::new(kind, error)
    }
}
