//! A job's completion window: the time it has to finish (OpenAI's batch
//! `completion_window`) before what has not run ends as `batch_expired`.

use std::fmt;
use std::time::Duration;

/// The error code of the items a job's window ended before they finished.
pub const BATCH_EXPIRED: &str = "batch_expired";

/// The message those items carry.
pub const EXPIRED_MESSAGE: &str = "the job's completion window ended before this request finished";

/// How long a job may take, as given (`24h`, `90m`, `1h30m`, `45s`, `2d`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletionWindow(Duration);

impl CompletionWindow {
    /// OpenAI's one window, and the Batch API's default.
    pub const DAY: CompletionWindow = CompletionWindow(Duration::from_secs(24 * 3600));

    /// A window of `duration` (at least a millisecond).
    pub fn new(duration: Duration) -> Self {
        Self(duration.max(Duration::from_millis(1)))
    }

    /// Reads a window: numbers with units `ms`, `s`, `m`, `h` or `d`,
    /// one after another (`1h30m`); zero is refused (a job that must
    /// already be over).
    ///
    /// ```
    /// use std::time::Duration;
    /// use cortex_queue::CompletionWindow;
    ///
    /// assert_eq!(CompletionWindow::parse("24h").unwrap(), CompletionWindow::DAY);
    /// assert_eq!(CompletionWindow::parse("1h30m").unwrap().duration(), Duration::from_secs(5400));
    /// assert!(CompletionWindow::parse("soon").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, BadDuration> {
        match parse_duration(text) {
            Some(d) if !d.is_zero() => Ok(Self::new(d)),
            _ => Err(BadDuration {
                what: "completion window",
                text: text.to_owned(),
                must_be: "a positive duration",
                like: "\"24h\", \"90m\" or \"1h30m\"",
            }),
        }
    }

    /// How long it is.
    pub fn duration(self) -> Duration {
        self.0
    }
}

impl fmt::Display for CompletionWindow {
    /// The shortest exact form in whole units (`24h`, `90m`, `1500ms`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        let units: [(u128, &str); 5] = [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1000, "s"),
            (1, "ms"),
        ];
        let (size, unit) = units
            .into_iter()
            .find(|(size, _)| ms.is_multiple_of(*size))
            .unwrap_or((1, "ms"));
        // Days read better as hours up to a week: OpenAI says "24h".
        if unit == "d" && ms / size < 7 {
            return write!(f, "{}h", ms / 3_600_000);
        }
        write!(f, "{}{unit}", ms / size)
    }
}

/// A duration given as text that is not one `what` takes: what it was
/// for, what it must be, and what one looks `like`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {text:?} is not {must_be} (like {like})")]
pub struct BadDuration {
    /// What the duration was for (`completion window`, `keep_alive`).
    pub what: &'static str,
    /// The text given.
    pub text: String,
    /// What it must be (`a positive duration`).
    pub must_be: &'static str,
    /// Examples of what it takes.
    pub like: &'static str,
}

/// A duration as text: numbers (decimals allowed) with units `ms`, `s`,
/// `m`, `h` or `d`, one after another (`1h30m`), or bare seconds. `None`
/// for anything else.
pub fn parse_duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    if let Ok(seconds) = text.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds).ok();
    }
    let mut total = 0.0;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
        let number: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        total += number
            * match &rest[..unit] {
                "ms" => 0.001,
                "s" => 1.0,
                "m" => 60.0,
                "h" => 3600.0,
                "d" => 86_400.0,
                _ => return None,
            };
        rest = &rest[unit..];
    }
    Duration::try_from_secs_f64(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_read_and_print_in_whole_units() {
        let show = |text: &str| CompletionWindow::parse(text).map(|w| w.to_string());
        assert_eq!(show("24h"), Ok("24h".into()));
        assert_eq!(show("1d"), Ok("24h".into()));
        assert_eq!(show("14d"), Ok("14d".into()));
        assert_eq!(show("90m"), Ok("90m".into()));
        assert_eq!(show("1h30m"), Ok("90m".into()));
        assert_eq!(show("1s"), Ok("1s".into()));
        assert_eq!(show("1.5s"), Ok("1500ms".into()));
        assert_eq!(show("30"), Ok("30s".into()));
        for bad in ["", "0", "0s", "-1h", "1x", "h", "1h-", "NaN"] {
            assert!(CompletionWindow::parse(bad).is_err(), "{bad:?}");
        }
    }
}
