//! A local path or an object's URL, and the store that holds the object.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::{Path as StorePath, PathPart};
use object_store::{BackoffConfig, ClientOptions, ObjectStore, RetryConfig};
use url::Url;

use crate::ObjectError;

/// Where an input is read from or an output written to.
#[derive(Debug, Clone)]
pub enum Location {
    /// A file on this machine (a plain path or `file://`).
    Local(PathBuf),
    /// An object in a store.
    Object(ObjectLocation),
}

/// An object's URL and the store that holds it.
#[derive(Clone)]
pub struct ObjectLocation {
    url: String,
    scheme: String,
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) path: StorePath,
}

impl fmt::Debug for ObjectLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.url)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Local(path) => write!(f, "{}", path.display()),
            Location::Object(object) => f.write_str(&object.url),
        }
    }
}

/// The schemes of stores, as `object_store` names them.
const STORE_SCHEMES: &[&str] = &["s3", "s3a", "gs", "az", "abfs", "abfss", "http", "https"];

impl Location {
    /// A path, or a URL (`s3://`, `gs://`, `az://`, `https://`, `file://`).
    /// Building a store reads its credentials from the environment; nothing
    /// is fetched yet.
    pub fn parse(text: &str) -> Result<Self, ObjectError> {
        let Some((scheme, _)) = text.split_once("://") else {
            return Ok(Location::Local(PathBuf::from(text)));
        };
        let bad = |reason: String| ObjectError::BadUrl {
            url: text.to_owned(),
            reason,
        };
        // A path may hold "://" (a folder named "a:"); only a scheme of
        // letters makes a URL.
        if scheme.is_empty() || !scheme.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Ok(Location::Local(PathBuf::from(text)));
        }
        let url = Url::parse(text).map_err(|e| bad(format!("not a URL ({e})")))?;
        match url.scheme() {
            "file" => url
                .to_file_path()
                .map(Location::Local)
                .map_err(|()| bad("not a local file URL (file:///absolute/path)".into())),
            scheme if STORE_SCHEMES.contains(&scheme) => {
                ObjectLocation::new(text, &url).map(Location::Object)
            }
            other => Err(bad(format!(
                "cortex reads and writes local paths, file://, s3://, gs://, az:// and https:// (read only), not {other}://"
            ))),
        }
    }

    /// The last part of the path or key (`in.parquet`), for default names.
    pub fn file_name(&self) -> Option<String> {
        match self {
            Location::Local(path) => path.file_name().map(|n| n.to_string_lossy().into_owned()),
            Location::Object(object) => object.path.filename().map(str::to_owned),
        }
    }

    /// That name without its extension (`in`), for the names of outputs.
    pub fn file_stem(&self) -> Option<String> {
        let name = self.file_name()?;
        Some(
            Path::new(&name)
                .file_stem()
                .map_or_else(|| name.clone(), |s| s.to_string_lossy().into_owned()),
        )
    }

    /// The same folder (or key prefix), another name: where an output's
    /// error file goes.
    pub fn with_file_name(&self, name: &str) -> Location {
        match self {
            Location::Local(path) => Location::Local(path.with_file_name(name)),
            Location::Object(object) => Location::Object(object.sibling(name)),
        }
    }

    /// The local path, when it is one.
    pub fn local(&self) -> Option<&Path> {
        match self {
            Location::Local(path) => Some(path),
            Location::Object(_) => None,
        }
    }
}

impl ObjectLocation {
    fn new(text: &str, url: &Url) -> Result<Self, ObjectError> {
        let scheme = url.scheme().to_owned();
        let bad = |reason: String| ObjectError::BadUrl {
            url: text.to_owned(),
            reason,
        };
        // Bounded: an unreachable store is an error within seconds.
        let retry = RetryConfig {
            backoff: BackoffConfig::default(),
            max_retries: 3,
            retry_timeout: Duration::from_secs(30),
        };
        let client = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(120));
        let store: Arc<dyn ObjectStore> = match scheme.as_str() {
            "s3" | "s3a" => {
                // A store on plain http (a local S3-compatible server) is
                // the user's choice, said by its endpoint.
                let endpoint = std::env::var("AWS_ENDPOINT_URL")
                    .or_else(|_| std::env::var("AWS_ENDPOINT"))
                    .unwrap_or_default();
                let allow_http = endpoint.starts_with("http://")
                    || std::env::var("AWS_ALLOW_HTTP").is_ok_and(|v| v == "true");
                let builder = AmazonS3Builder::from_env()
                    .with_url(text)
                    .with_retry(retry)
                    .with_client_options(client)
                    .with_allow_http(allow_http);
                Arc::new(builder.build().map_err(|e| bad(e.to_string()))?)
            }
            "gs" => Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_url(text)
                    .with_retry(retry)
                    .with_client_options(client)
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "az" | "abfs" | "abfss" => Arc::new(
                MicrosoftAzureBuilder::from_env()
                    .with_url(text)
                    .with_retry(retry)
                    .with_client_options(client)
                    .build()
                    .map_err(|e| match e.to_string() {
                        m if m.contains("Account must be specified") => bad(
                            "no storage account: set AZURE_STORAGE_ACCOUNT_NAME (and AZURE_STORAGE_ACCOUNT_KEY or a token), or AZURE_STORAGE_USE_EMULATOR=true".into(),
                        ),
                        m => bad(m),
                    })?,
            ),
            _ => {
                let base = format!("{scheme}://{}", url.authority());
                Arc::new(
                    HttpBuilder::new()
                        .with_url(base)
                        .with_retry(retry)
                        .with_client_options(client.with_allow_http(scheme == "http"))
                        .build()
                        .map_err(|e| bad(e.to_string()))?,
                )
            }
        };
        // The bucket or container is the host (`az://container/key`,
        // `abfss://container@account.dfs.core.windows.net/key`); the key is
        // the path.
        let path = StorePath::from_url_path(url.path()).map_err(|e| bad(e.to_string()))?;
        Self::with_key(text, scheme, store, path)
    }

    fn with_key(
        text: &str,
        scheme: String,
        store: Arc<dyn ObjectStore>,
        path: StorePath,
    ) -> Result<Self, ObjectError> {
        if path.as_ref().is_empty() {
            return Err(ObjectError::BadUrl {
                url: text.to_owned(),
                reason: "names no object (a bucket alone)".into(),
            });
        }
        Ok(Self {
            url: text.to_owned(),
            scheme,
            store,
            path,
        })
    }

    fn sibling(&self, name: &str) -> Self {
        let parts: Vec<PathPart<'_>> = self.path.parts().collect();
        let path = parts[..parts.len().saturating_sub(1)]
            .iter()
            .cloned()
            .chain(std::iter::once(PathPart::from(name)))
            .collect();
        let folder = self
            .url
            .rfind('/')
            .map_or(self.url.as_str(), |i| &self.url[..=i]);
        Self {
            url: format!("{folder}{name}"),
            scheme: self.scheme.clone(),
            store: Arc::clone(&self.store),
            path,
        }
    }

    /// The URL as given.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Adds what to do when a store was reached without credentials (the
    /// client then asks a cloud machine's metadata service, which is not
    /// there): the variables that give them.
    pub(crate) fn explain(&self, error: ObjectError) -> ObjectError {
        let ObjectError::Store { url, detail } = error else {
            return error;
        };
        let (variable, hint) = match self.scheme.as_str() {
            "s3" | "s3a" => (
                "AWS_ACCESS_KEY_ID",
                "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_SKIP_SIGNATURE=true for a public bucket)",
            ),
            "gs" => (
                "GOOGLE_SERVICE_ACCOUNT",
                "no credentials: set GOOGLE_SERVICE_ACCOUNT (a service account's JSON file)",
            ),
            _ => return ObjectError::Store { url, detail },
        };
        let metadata_service = detail.contains("169.254.169.254") || detail.contains("metadata");
        if metadata_service && std::env::var_os(variable).is_none() {
            return ObjectError::Store {
                url,
                detail: format!("{hint} ({detail})"),
            };
        }
        ObjectError::Store { url, detail }
    }

    /// Whether objects can be written there (`https://` is read only).
    pub fn check_writable(&self) -> Result<(), ObjectError> {
        if matches!(self.scheme.as_str(), "http" | "https") {
            return Err(ObjectError::ReadOnly {
                url: self.url.clone(),
                scheme: self.scheme.clone(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_paths_and_urls_name_their_store() {
        assert!(
            matches!(Location::parse("in.jsonl").unwrap(), Location::Local(p) if p == Path::new("in.jsonl"))
        );
        assert!(
            matches!(Location::parse("file:///tmp/in.jsonl").unwrap(), Location::Local(p) if p == Path::new("/tmp/in.jsonl"))
        );
        let s3 = Location::parse("s3://bucket/dir/in.parquet").unwrap();
        assert_eq!(s3.file_name().as_deref(), Some("in.parquet"));
        assert_eq!(s3.file_stem().as_deref(), Some("in"));
        assert_eq!(s3.to_string(), "s3://bucket/dir/in.parquet");
        let Location::Object(object) = &s3 else {
            panic!("s3 is a store")
        };
        assert_eq!(object.path.as_ref(), "dir/in.parquet");
        // Azure needs an account before anything is sent (the emulator test
        // in tests/tests/object_store.rs has one).
        let error = Location::parse("az://container/dir/in.jsonl")
            .unwrap_err()
            .to_string();
        assert!(error.contains("AZURE_STORAGE_ACCOUNT_NAME"), "{error}");
        let https = Location::parse("https://example.invalid/data/in.jsonl").unwrap();
        let Location::Object(object) = &https else {
            panic!("https is a store")
        };
        assert_eq!(object.path.as_ref(), "data/in.jsonl");
        assert!(object.check_writable().is_err());
        let errors = s3.with_file_name("in.errors.jsonl");
        assert_eq!(errors.to_string(), "s3://bucket/dir/in.errors.jsonl");
        let Location::Object(object) = &errors else {
            panic!("still a store")
        };
        assert_eq!(object.path.as_ref(), "dir/in.errors.jsonl");
    }

    #[test]
    fn unknown_schemes_and_bare_buckets_are_refused_by_name() {
        let error = Location::parse("ftp://host/in.jsonl")
            .unwrap_err()
            .to_string();
        assert!(error.contains("not ftp://"), "{error}");
        let error = Location::parse("s3://bucket").unwrap_err().to_string();
        assert!(error.contains("names no object"), "{error}");
    }
}
