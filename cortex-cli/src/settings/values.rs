//! The types settings hold, and how each is read from text and shown.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use cortex_engine::{CpuKernels, DeviceChoice, GpuLayers};
use cortex_server::KeepAlive;
use cortex_webhooks::SigningSecret;

/// How a value is shown and read back: `cortex config` prints it, and
/// the same text parses to it again.
pub(crate) trait SettingValue: FromStr + Sized {
    fn shown(&self) -> String;
}

macro_rules! shown_by_display {
    ($($ty:ty),* $(,)?) => {
        $(impl SettingValue for $ty {
            fn shown(&self) -> String {
                self.to_string()
            }
        })*
    };
}

shown_by_display!(
    usize,
    u64,
    u32,
    u16,
    i32,
    bool,
    String,
    DeviceChoice,
    GpuLayers,
    CpuKernels,
    KeepAlive,
    NameList
);

impl SettingValue for ApiKeys {
    /// Never the keys themselves: how many there are (none: empty).
    fn shown(&self) -> String {
        if self.0.is_empty() {
            String::new()
        } else {
            self.to_string()
        }
    }
}

impl SettingValue for SigningSecret {
    /// Never the key: `whsec_… (set)`, or empty.
    fn shown(&self) -> String {
        self.to_string()
    }
}

impl SettingValue for PathBuf {
    fn shown(&self) -> String {
        self.display().to_string()
    }
}

/// A value, or `auto`: chosen by what the setting depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OrAuto<T> {
    Auto,
    Value(T),
}

impl<T: Copy> OrAuto<T> {
    /// The value given, `None` for auto (the library's "for the device").
    pub(crate) fn given(self) -> Option<T> {
        match self {
            OrAuto::Auto => None,
            OrAuto::Value(value) => Some(value),
        }
    }
}

/// What an [`OrAuto`] setting takes, for its error (`cause`: why the
/// value did not parse).
pub(crate) trait AutoAlternative {
    fn expected(cause: &dyn fmt::Display) -> String;
}

impl AutoAlternative for usize {
    fn expected(cause: &dyn fmt::Display) -> String {
        format!("auto or a number ({cause})")
    }
}

impl AutoAlternative for bool {
    fn expected(_: &dyn fmt::Display) -> String {
        "auto, true or false".to_owned()
    }
}

impl<T: FromStr + AutoAlternative> FromStr for OrAuto<T>
where
    T::Err: fmt::Display,
{
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        if raw.trim().eq_ignore_ascii_case("auto") {
            return Ok(OrAuto::Auto);
        }
        raw.trim()
            .parse()
            .map(OrAuto::Value)
            .map_err(|e| format!("{raw:?}: expected {}", T::expected(&e)))
    }
}

impl<T: fmt::Display> fmt::Display for OrAuto<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OrAuto::Auto => f.write_str("auto"),
            OrAuto::Value(value) => value.fmt(f),
        }
    }
}

impl<T: FromStr + AutoAlternative + fmt::Display> SettingValue for OrAuto<T>
where
    T::Err: fmt::Display,
{
    fn shown(&self) -> String {
        self.to_string()
    }
}

/// API keys: a list in the file, comma-separated in `CORTEX_API_KEYS`,
/// `--api-key` once per key; shown only as a count (`Debug` too).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct ApiKeys(pub(crate) Vec<String>);

impl fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ApiKeys{self}")
    }
}

impl FromStr for ApiKeys {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        let keys: Vec<String> = raw
            .split(',')
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned)
            .collect();
        if keys.is_empty() && !raw.trim().is_empty() {
            return Err("no keys in it".into());
        }
        Ok(Self(keys))
    }
}

impl fmt::Display for ApiKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.len() {
            0 => f.write_str("(none: no key needed)"),
            1 => f.write_str("(1 key)"),
            n => write!(f, "({n} keys)"),
        }
    }
}

/// A list of names (hosts, origins): a list in the file, comma-separated in
/// the environment and on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NameList(pub(crate) Vec<String>);

impl FromStr for NameList {
    type Err = std::convert::Infallible;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        Ok(Self(
            raw.split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect(),
        ))
    }
}

impl fmt::Display for NameList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join(","))
    }
}
