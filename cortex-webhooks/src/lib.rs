//! Delivers the queue's webhook events: each job that names a URL has an
//! event in the queue's outbox when it ends (`batch.completed`,
//! `batch.failed`, `batch.cancelled`, `batch.expired`, added in the
//! transaction that ends it); a [`Deliverer`] thread beside a worker or a
//! server takes due events, POSTs OpenAI's event body signed the way OpenAI
//! signs its webhooks (the Standard Webhooks scheme: `webhook-id`,
//! `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256>`), and
//! records the outcome: delivered, or tried again after a backoff. At least
//! once: a process killed between the job's end and the delivery leaves the
//! event for the next one. The same outbox carries a job's `export` rows
//! (its results to the destination it named, `cortex submit --output`): the
//! deliverer hands them to an [`Exporter`] the binary gives it.
//!
//! ```
//! use cortex_webhooks::{SigningSecret, check_url, sign};
//!
//! let secret: SigningSecret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=".parse()?;
//! let body = br#"{"type": "batch.completed"}"#;
//! let header = sign(&secret, "evt_1", 1_700_000_000, body);
//! assert!(header.starts_with("v1,"));
//! // Another message, another signature; the key itself is never shown.
//! assert_ne!(header, sign(&secret, "evt_2", 1_700_000_000, body));
//! assert_eq!(secret.to_string(), "whsec_… (set)");
//! assert!(check_url("ftp://example.com/hook").is_err());
//! # Ok::<(), String>(())
//! ```
//!
//! # Design notes
//!
//! The outbox, its leases and backoff are the queue's (`WebhookStore`, on
//! both drivers); the event's JSON is the wire-format crate's
//! (`cortex_openai::webhook_event`); this crate signs, sends and runs the
//! delivery thread. Deliveries use their own queue connection and thread so
//! a slow receiver never holds up a worker's engine.

#![forbid(unsafe_code)]

mod deliver;
mod sign;

pub use deliver::{Deliverer, DeliveryError, Exporter, Notifier};
pub use sign::{SigningSecret, sign};

/// Checks a URL events can be sent to: `http://` or `https://`.
pub fn check_url(url: &str) -> Result<(), NotHttpUrl> {
    if url.starts_with("http://") || url.starts_with("https://") {
        Ok(())
    } else {
        Err(NotHttpUrl(url.to_owned()))
    }
}

/// A webhook URL that is not `http://` or `https://`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected an http:// or https:// URL, got {0:?}")]
pub struct NotHttpUrl(pub String);
