//! Standard Webhooks signatures, as OpenAI's webhooks carry them.

use std::fmt;
use std::str::FromStr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The key events are signed with: given as `whsec_` and the key's bytes in
/// base64 (what OpenAI's dashboard shows and the `standardwebhooks` package
/// reads; `openssl rand -base64 32` makes one).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct SigningSecret(Vec<u8>);

impl SigningSecret {
    /// Whether there is none (events go unsigned).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for SigningSecret {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let raw = raw.trim();
        if raw.is_empty() {
            return Ok(Self::default());
        }
        let encoded = raw.strip_prefix("whsec_").unwrap_or(raw);
        match STANDARD.decode(encoded) {
            Ok(key) if key.len() >= 16 => Ok(Self(key)),
            Ok(_) => Err("the key is shorter than 16 bytes".into()),
            Err(_) => {
                Err("expected whsec_ and base64 (openssl rand -base64 32 makes a key)".into())
            }
        }
    }
}

/// Never the key itself.
impl fmt::Display for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            Ok(())
        } else {
            f.write_str("whsec_… (set)")
        }
    }
}

impl fmt::Debug for SigningSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SigningSecret({self})")
    }
}

/// The `webhook-signature` header of a message: `v1,` and the base64
/// HMAC-SHA256 of `{id}.{timestamp}.{body}` under `secret`.
pub fn sign(secret: &SigningSecret, id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(&secret.0).expect("HMAC takes any key length");
    mac.update(format!("{id}.{timestamp}.").as_bytes());
    mac.update(body);
    format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_match_the_standard_webhooks_reference() {
        // The example in the Standard Webhooks specification.
        let secret: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn secrets_are_base64_keys_and_never_shown() {
        assert!("".parse::<SigningSecret>().unwrap().is_empty());
        assert!("whsec_short".parse::<SigningSecret>().is_err());
        assert!("not base64!".parse::<SigningSecret>().is_err());
        let secret: SigningSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".parse().unwrap();
        assert!(!secret.to_string().contains("MfKQ"));
    }
}
