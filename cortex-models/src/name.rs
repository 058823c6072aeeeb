//! Model names as people type them: `name[:tag]`, the tag `latest` when
//! left out, the same forms in the CLI, the config, OpenAI's `model` and
//! Ollama's.

use std::fmt;
use std::str::FromStr;

/// The tag a name without one means.
pub const DEFAULT_TAG: &str = "latest";

const MAX_PART: usize = 128;

/// A registry name: `name:tag`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelName {
    name: String,
    tag: String,
}

/// Why a string is not a model name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{given:?} is not a model name: {reason} (a name is letters, digits, '.', '_' and '-', starting with a letter or digit, at most {MAX_PART} of them, with an optional ':tag' of the same)"
)]
pub struct NameError {
    /// What was given.
    pub given: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

fn check_part(part: &str) -> Result<(), &'static str> {
    if part.is_empty() {
        return Err("a part is empty");
    }
    if part.len() > MAX_PART {
        return Err("a part is too long");
    }
    if !part.starts_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err("a part starts with a symbol");
    }
    if !part
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        return Err("it holds a character other than letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

impl ModelName {
    /// `name` with `tag`, both checked.
    pub fn new(name: &str, tag: &str) -> Result<Self, NameError> {
        let error = |reason| NameError {
            given: format!("{name}:{tag}"),
            reason,
        };
        check_part(name).map_err(error)?;
        check_part(tag).map_err(error)?;
        Ok(Self {
            name: name.to_owned(),
            tag: tag.to_owned(),
        })
    }

    /// The name without its tag.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The tag.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// Whether `given` (as a person typed it: with or without a tag, any
    /// letter case) names this model.
    pub fn matches(&self, given: &str) -> bool {
        match given.parse::<ModelName>() {
            Ok(other) => {
                other.name.eq_ignore_ascii_case(&self.name)
                    && other.tag.eq_ignore_ascii_case(&self.tag)
            }
            Err(_) => false,
        }
    }
}

impl FromStr for ModelName {
    type Err = NameError;

    fn from_str(given: &str) -> Result<Self, NameError> {
        let (name, tag) = given.split_once(':').unwrap_or((given, DEFAULT_TAG));
        ModelName::new(name, tag).map_err(|e| NameError {
            given: given.to_owned(),
            reason: e.reason,
        })
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.name, self.tag)
    }
}

impl serde::Serialize for ModelName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Whether a model setting names a file rather than a registry name: it
/// holds a path separator or ends in `.gguf`.
pub fn is_path(setting: &str) -> bool {
    setting.contains('/')
        || setting.contains('\\')
        || setting.to_ascii_lowercase().ends_with(".gguf")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_take_latest_when_no_tag_is_given() {
        let name: ModelName = "smollm2-135m".parse().unwrap();
        assert_eq!(name.to_string(), "smollm2-135m:latest");
        let tagged: ModelName = "mine:v2.1".parse().unwrap();
        assert_eq!((tagged.name(), tagged.tag()), ("mine", "v2.1"));
        assert!(name.matches("SmolLM2-135M"));
        assert!(name.matches("smollm2-135m:latest"));
        assert!(!name.matches("smollm2-135m:v2"));
    }

    #[test]
    fn bad_names_say_what_is_wrong() {
        for (given, reason) in [
            ("", "a part is empty"),
            ("a:", "a part is empty"),
            ("-a", "a part starts with a symbol"),
            ("a b", "it holds a character"),
            ("a:b:c", "it holds a character"),
        ] {
            let error = given.parse::<ModelName>().unwrap_err().to_string();
            assert!(
                error.starts_with(&format!("{given:?} is not a model name: {reason}")),
                "{error}"
            );
        }
        assert!("x".repeat(129).parse::<ModelName>().is_err());
    }

    #[test]
    fn paths_are_told_from_names() {
        assert!(is_path("./m.gguf"));
        assert!(is_path("m.GGUF"));
        assert!(is_path("/models/m"));
        assert!(!is_path("gemma3-270m"));
        assert!(!is_path("mine:v2"));
    }
}
