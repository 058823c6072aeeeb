//! Turning token bytes into text safely: UTF-8 is never split across events,
//! and stop strings never leak into the output, not even in part.

/// Accumulates token bytes and releases only complete UTF-8 characters.
#[derive(Debug, Default, Clone)]
pub(crate) struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Appends `bytes` and returns the text that is now complete. Invalid
    /// sequences (not merely unfinished ones) become U+FFFD.
    pub(crate) fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(text) => {
                    out.push_str(text);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("checked prefix"),
                    );
                    match e.error_len() {
                        // Unfinished character at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left at the end (an unfinished character becomes U+FFFD).
    pub(crate) fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

/// Holds back text while a stop string may still be forming.
#[derive(Debug, Clone)]
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    /// Text generated but not yet released.
    held: String,
}

/// What the matcher decided for a piece of text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StopScan {
    /// Text safe to release now (may be empty).
    Continue(String),
    /// A stop string matched: release this text and end the completion.
    Stopped(String),
}

impl StopMatcher {
    pub(crate) fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            held: String::new(),
        }
    }

    /// Adds newly decoded text.
    pub(crate) fn push(&mut self, text: &str) -> StopScan {
        if self.stops.is_empty() {
            return StopScan::Continue(text.to_owned());
        }
        self.held.push_str(text);
        let first_match = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first_match {
            let released = self.held[..at].to_owned();
            self.held.clear();
            return StopScan::Stopped(released);
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|stop| longest_suffix_prefix(&self.held, stop))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let released = self.held[..cut].to_owned();
        self.held.drain(..cut);
        StopScan::Continue(released)
    }

    /// The held text, released when the completion ends for another reason.
    pub(crate) fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`,
/// at a character boundary.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && stop
                    .as_bytes()
                    .starts_with(&text.as_bytes()[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_characters_are_never_split() {
        let mut s = Utf8Stream::default();
        let snowman = "☃".as_bytes(); // 3 bytes
        assert_eq!(s.push(&snowman[..1]), "");
        assert_eq!(s.push(&snowman[1..2]), "");
        assert_eq!(s.push(&[snowman[2], b'!']), "☃!");
        let emoji = "🦀".as_bytes();
        assert_eq!(s.push(&emoji[..2]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.push(&[0xff, b'a']), "\u{FFFD}a");
    }

    #[test]
    fn stop_strings_are_held_back_and_never_leak() {
        let mut m = StopMatcher::new(vec!["END".into(), "\n\n".into()]);
        assert_eq!(m.push("Hello E"), StopScan::Continue("Hello ".into()));
        assert_eq!(m.push("N"), StopScan::Continue(String::new()));
        assert_eq!(m.push("X more"), StopScan::Continue("ENX more".into()));
        assert_eq!(m.push(" text\n"), StopScan::Continue(" text".into()));
        assert_eq!(m.push("\nafter"), StopScan::Stopped(String::new()));

        let mut m = StopMatcher::new(vec!["stop".into()]);
        assert_eq!(m.push("a sto"), StopScan::Continue("a ".into()));
        assert_eq!(m.finish(), "sto");
        assert_eq!(m.push("xx stopyy"), StopScan::Stopped("xx ".into()));
    }

    #[test]
    fn the_earliest_stop_string_wins() {
        let mut m = StopMatcher::new(vec!["bb".into(), "ab".into()]);
        assert_eq!(m.push("xabb"), StopScan::Stopped("x".into()));
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.push("caf"), StopScan::Continue("caf".into()));
        assert_eq!(m.push("é"), StopScan::Continue(String::new()));
        assert_eq!(m.push("!"), StopScan::Stopped(String::new()));
    }
}
