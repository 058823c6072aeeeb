//! TLS to the server, as libpq's `sslmode` and `sslrootcert` URL parameters
//! say (`postgres://…/cortex?sslmode=verify-full&sslrootcert=/etc/ca.pem`):
//!
//! - `disable`: plain TCP.
//! - `prefer` (the default, as in libpq): TLS when the server offers it,
//!   its certificate unchecked; plain TCP otherwise.
//! - `require`: TLS or no connection; the certificate unchecked unless
//!   `sslrootcert` is given (then as `verify-ca`, as libpq does).
//! - `verify-ca`: TLS with a certificate signed by `sslrootcert` (or a
//!   system root); any host name.
//! - `verify-full`: that, and the certificate names the host connected to.
//!
//! The client library parses only the first three, so both parameters are
//! taken off the URL here and the rest handed on.

use std::path::PathBuf;
use std::str::FromStr;

use native_tls::{Certificate, TlsConnector};
use postgres::NoTls;
use postgres::config::SslMode;
use postgres_native_tls::MakeTlsConnector;

use crate::session::describe;

/// Connects to `url` (its TLS parameters applied), after `configure` has
/// set what the caller wants of the connection.
pub(crate) fn connect(
    url: &str,
    configure: impl FnOnce(&mut postgres::Config),
) -> Result<postgres::Client, String> {
    let (url, tls) = split(url)?;
    let mut pg =
        postgres::Config::from_str(&url).map_err(|e| format!("not a PostgreSQL URL: {e}"))?;
    pg.ssl_mode(tls.ssl_mode());
    configure(&mut pg);
    let connected = match tls.mode {
        Mode::Disable => pg.connect(NoTls),
        _ => pg.connect(tls.connector()?),
    };
    connected.map_err(|e| describe(&e))
}

/// How much of the server to trust.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// A URL's TLS settings, split off it.
#[derive(Debug)]
pub(crate) struct Tls {
    mode: Mode,
    root_cert: Option<PathBuf>,
}

/// Splits `sslmode` and `sslrootcert` off `url`'s query: (the URL without
/// them, the settings).
pub(crate) fn split(url: &str) -> Result<(String, Tls), String> {
    let mut tls = Tls {
        mode: Mode::Prefer,
        root_cert: None,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), tls));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => {
                tls.mode = match value {
                    "disable" => Mode::Disable,
                    "prefer" | "allow" => Mode::Prefer,
                    "require" => Mode::Require,
                    "verify-ca" => Mode::VerifyCa,
                    "verify-full" => Mode::VerifyFull,
                    other => {
                        return Err(format!(
                            "sslmode={other} is not one of disable, prefer, require, verify-ca, verify-full"
                        ));
                    }
                };
            }
            "sslrootcert" => tls.root_cert = Some(PathBuf::from(percent_decoded(value)?)),
            _ => kept.push(pair),
        }
    }
    if tls.mode == Mode::Require && tls.root_cert.is_some() {
        tls.mode = Mode::VerifyCa;
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, tls))
}

/// `%XX` escapes of a URL parameter decoded (a path may hold any byte).
fn percent_decoded(value: &str) -> Result<String, String> {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = value
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("sslrootcert={value}: a bad %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("sslrootcert={value}: not UTF-8"))
}

impl Tls {
    /// What the client library is told to do: TLS optional or required.
    pub(crate) fn ssl_mode(&self) -> SslMode {
        match self.mode {
            Mode::Disable => SslMode::Disable,
            Mode::Prefer => SslMode::Prefer,
            Mode::Require | Mode::VerifyCa | Mode::VerifyFull => SslMode::Require,
        }
    }

    /// The connector that checks what the mode says.
    pub(crate) fn connector(&self) -> Result<MakeTlsConnector, String> {
        let mut builder = TlsConnector::builder();
        match self.mode {
            Mode::Disable | Mode::Prefer | Mode::Require => {
                builder.danger_accept_invalid_certs(true);
            }
            Mode::VerifyCa => {
                builder.danger_accept_invalid_hostnames(true);
            }
            Mode::VerifyFull => {}
        }
        if let Some(path) = &self.root_cert {
            let pem =
                std::fs::read(path).map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
            let root = Certificate::from_pem(&pem).map_err(|e| {
                format!("sslrootcert {}: not a PEM certificate: {e}", path.display())
            })?;
            builder.add_root_certificate(root);
        }
        let connector = builder
            .build()
            .map_err(|e| format!("cannot set up TLS: {e}"))?;
        Ok(MakeTlsConnector::new(connector))
    }
}

#[cfg(test)]
mod tests {
    use super::{Mode, split};

    #[test]
    fn tls_parameters_are_taken_off_the_url() {
        let (url, tls) = split(
            "postgres://u@h/db?sslmode=verify-full&application_name=x&sslrootcert=/a%20b.pem",
        )
        .unwrap();
        assert_eq!(url, "postgres://u@h/db?application_name=x");
        assert_eq!(tls.mode, Mode::VerifyFull);
        assert_eq!(tls.root_cert.unwrap().to_str(), Some("/a b.pem"));
        let (url, tls) = split("postgres://u@h/db").unwrap();
        assert_eq!(
            (url.as_str(), tls.mode),
            ("postgres://u@h/db", Mode::Prefer)
        );
        let (_, tls) = split("postgres://u@h/db?sslmode=require&sslrootcert=ca.pem").unwrap();
        assert_eq!(
            tls.mode,
            Mode::VerifyCa,
            "require with a root certificate verifies"
        );
        let error = split("postgres://u@h/db?sslmode=maybe").unwrap_err();
        assert!(error.contains("sslmode=maybe"), "{error}");
    }
}
