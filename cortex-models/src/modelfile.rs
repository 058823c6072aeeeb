//! What a registered model carries beside its weights (a system prompt, a
//! chat template, default sampling parameters) and the subset of Ollama's
//! Modelfile that sets them: `FROM`, `SYSTEM`, `TEMPLATE`, `PARAMETER`.

use std::fmt::Write as _;

/// A model's own settings, applied to requests that do not set them.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelSettings {
    /// The system prompt used when a conversation has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// A chat template (Jinja, as in a GGUF's `tokenizer.chat_template`)
    /// used instead of the model's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Default sampling and length parameters, in the order given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parameters: Vec<Parameter>,
}

/// One `PARAMETER name value`, checked against what cortex understands.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Parameter {
    /// Ollama's option name (`temperature`, `num_predict`, `stop`, ...).
    pub name: String,
    /// Its value: a number, or the text of a stop string.
    pub value: ParameterValue,
}

/// A parameter's value.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
pub enum ParameterValue {
    /// An integer (`top_k`, `num_predict`, `seed`, ...).
    Int(i64),
    /// A real number (`temperature`, `top_p`, ...).
    Float(f64),
    /// Text (`stop`).
    Text(String),
}

#[derive(Clone, Copy)]
enum Kind {
    Int,
    Float,
    Text,
}

/// The parameters cortex applies, with their kinds.
const PARAMETERS: &[(&str, Kind)] = &[
    ("temperature", Kind::Float),
    ("top_p", Kind::Float),
    ("min_p", Kind::Float),
    ("repeat_penalty", Kind::Float),
    ("presence_penalty", Kind::Float),
    ("frequency_penalty", Kind::Float),
    ("top_k", Kind::Int),
    ("num_predict", Kind::Int),
    ("seed", Kind::Int),
    ("num_ctx", Kind::Int),
    ("repeat_last_n", Kind::Int),
    ("stop", Kind::Text),
];

/// A Modelfile `PARAMETER` cortex cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParameterError {
    /// Not one cortex understands.
    #[error("unknown parameter {name:?} (cortex understands {known})")]
    Unknown {
        /// The name given.
        name: String,
        /// Those cortex understands, listed.
        known: String,
    },
    /// A value of the wrong kind.
    #[error("{name} takes {wants}, not {value:?}")]
    WrongValue {
        /// The parameter.
        name: String,
        /// What it takes (`an integer`, `a number`, `a finite number`).
        wants: &'static str,
        /// The value given.
        value: String,
    },
}

impl Parameter {
    /// `name` set to `value` (as written in a Modelfile: a number, or text
    /// that may be quoted).
    pub fn parse(name: &str, value: &str) -> Result<Self, ParameterError> {
        let Some((_, kind)) = PARAMETERS.iter().find(|(known, _)| *known == name) else {
            let known: Vec<&str> = PARAMETERS.iter().map(|(n, _)| *n).collect();
            return Err(ParameterError::Unknown {
                name: name.to_owned(),
                known: known.join(", "),
            });
        };
        let value = value.trim();
        let wrong = |wants: &'static str| ParameterError::WrongValue {
            name: name.to_owned(),
            wants,
            value: value.to_owned(),
        };
        let value = match kind {
            Kind::Int => ParameterValue::Int(value.parse().map_err(|_| wrong("an integer"))?),
            Kind::Float => {
                let number: f64 = value.parse().map_err(|_| wrong("a number"))?;
                if !number.is_finite() {
                    return Err(wrong("a finite number"));
                }
                ParameterValue::Float(number)
            }
            Kind::Text => ParameterValue::Text(unquote(value).to_owned()),
        };
        Ok(Self {
            name: name.to_owned(),
            value,
        })
    }

    /// The value as a number, if it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self.value {
            ParameterValue::Int(v) => Some(v as f64),
            ParameterValue::Float(v) => Some(v),
            ParameterValue::Text(_) => None,
        }
    }
}

impl std::fmt::Display for ParameterValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParameterValue::Int(v) => write!(f, "{v}"),
            ParameterValue::Float(v) => write!(f, "{v}"),
            ParameterValue::Text(v) => write!(f, "{v:?}"),
        }
    }
}

fn unquote(value: &str) -> &str {
    value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(value)
}

impl ModelSettings {
    /// These settings with `newer`'s on top: its system prompt and template
    /// where it has them, its parameters replacing those of the same name.
    pub fn overlaid(&self, newer: &ModelSettings) -> ModelSettings {
        let mut parameters: Vec<Parameter> = self
            .parameters
            .iter()
            .filter(|p| !newer.parameters.iter().any(|n| n.name == p.name))
            .cloned()
            .collect();
        parameters.extend(newer.parameters.iter().cloned());
        ModelSettings {
            system: newer.system.clone().or_else(|| self.system.clone()),
            template: newer.template.clone().or_else(|| self.template.clone()),
            parameters,
        }
    }

    /// The parameters as Ollama's `/api/show` writes them: one per line.
    pub fn parameters_text(&self) -> String {
        let mut text = String::new();
        for p in &self.parameters {
            let _ = writeln!(text, "{:<15} {}", p.name, p.value);
        }
        text
    }

    /// A Modelfile that recreates the model from `from`.
    pub fn modelfile(&self, from: &str) -> String {
        let mut text = format!("# Modelfile generated by cortex\nFROM {from}\n");
        if let Some(template) = &self.template {
            let _ = writeln!(text, "TEMPLATE \"\"\"{template}\"\"\"");
        }
        if let Some(system) = &self.system {
            let _ = writeln!(text, "SYSTEM \"\"\"{system}\"\"\"");
        }
        for p in &self.parameters {
            let _ = writeln!(text, "PARAMETER {} {}", p.name, p.value);
        }
        text
    }
}

/// A parsed Modelfile.
#[derive(Debug, Clone, PartialEq)]
pub struct Modelfile {
    /// What `FROM` names: a model name, a GGUF path, or `sha256:<hex>` of an
    /// uploaded blob.
    pub from: String,
    /// What the other instructions set.
    pub settings: ModelSettings,
}

/// Whether `text` is a Jinja template's: Jinja always holds `{{` or `{%`
/// (what tells a template's text from a name or a file's path).
pub fn is_jinja(text: &str) -> bool {
    text.contains("{{") || text.contains("{%")
}

/// Whether `text` can be a `TEMPLATE`: a Jinja template's text (it holds
/// `{{` or `{%`) or the name of a template llama.cpp renders (`chatml`),
/// never a path, which a server would read for whoever made the model.
pub fn check_template_shape(text: &str) -> Result<(), String> {
    let jinja = is_jinja(text);
    let name = (1..=64).contains(&text.len())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if jinja || name {
        return Ok(());
    }
    Err(format!(
        "TEMPLATE {:?} is neither a Jinja template (holding {{{{ or {{%) nor the name of a template llama.cpp renders (such as chatml)",
        text.chars().take(80).collect::<String>()
    ))
}

/// A Modelfile's mistake, by line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Modelfile line {line}: {message}")]
pub struct ModelfileError {
    /// 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

/// The most a Modelfile may hold: it is read from requests too.
pub const MAX_MODELFILE_BYTES: usize = 1 << 20;

impl Modelfile {
    /// Parses the subset cortex understands; anything else is an error that
    /// names its line.
    pub fn parse(text: &str) -> Result<Self, ModelfileError> {
        let error = |line: usize, message: String| ModelfileError { line, message };
        if text.len() > MAX_MODELFILE_BYTES {
            return Err(error(1, format!("longer than {MAX_MODELFILE_BYTES} bytes")));
        }
        let lines: Vec<&str> = text.lines().collect();
        let mut from = None;
        let mut settings = ModelSettings::default();
        let mut i = 0;
        while i < lines.len() {
            let number = i + 1;
            let line = lines[i].trim();
            i += 1;
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (instruction, rest) = line
                .split_once(char::is_whitespace)
                .map_or((line, ""), |(a, b)| (a, b.trim()));
            let mut argument = || -> Result<String, ModelfileError> {
                let Some(opened) = rest.strip_prefix("\"\"\"") else {
                    return Ok(unquote(rest).to_owned());
                };
                if let Some(whole) = opened.strip_suffix("\"\"\"") {
                    return Ok(whole.to_owned());
                }
                let mut value = opened.to_owned();
                while i < lines.len() {
                    let next = lines[i];
                    i += 1;
                    value.push('\n');
                    if let Some(end) = next.find("\"\"\"") {
                        value.push_str(&next[..end]);
                        return Ok(value);
                    }
                    value.push_str(next);
                }
                Err(error(number, "a \"\"\" is never closed".into()))
            };
            match instruction.to_ascii_uppercase().as_str() {
                "FROM" => {
                    let value = argument()?;
                    if value.is_empty() {
                        return Err(error(number, "FROM needs a model name or a path".into()));
                    }
                    if from.replace(value).is_some() {
                        return Err(error(number, "a second FROM".into()));
                    }
                }
                "SYSTEM" => settings.system = Some(argument()?),
                "TEMPLATE" => {
                    let template = argument()?;
                    check_template_shape(&template).map_err(|why| error(number, why))?;
                    settings.template = Some(template);
                }
                "PARAMETER" => {
                    let (name, value) = rest.split_once(char::is_whitespace).ok_or_else(|| {
                        error(number, "PARAMETER needs a name and a value".into())
                    })?;
                    let parameter =
                        Parameter::parse(name, value).map_err(|e| error(number, e.to_string()))?;
                    settings.parameters.push(parameter);
                }
                "ADAPTER" | "LICENSE" | "MESSAGE" | "REQUIRES" => {
                    return Err(error(
                        number,
                        format!(
                            "{instruction} is not supported by cortex (it reads FROM, SYSTEM, TEMPLATE and PARAMETER)"
                        ),
                    ));
                }
                _ => {
                    return Err(error(
                        number,
                        format!(
                            "unknown instruction {instruction:?} (expected FROM, SYSTEM, TEMPLATE or PARAMETER)"
                        ),
                    ));
                }
            }
        }
        let from = from.ok_or_else(|| error(lines.len().max(1), "no FROM line".into()))?;
        Ok(Self { from, settings })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subset_parses() {
        let file = Modelfile::parse(
            "# mine\nFROM ./m.gguf\nSYSTEM \"\"\"You are terse.\nVery.\"\"\"\nPARAMETER temperature 0.2\nPARAMETER stop \"<|im_end|>\"\nparameter num_predict 32\n",
        )
        .unwrap();
        assert_eq!(file.from, "./m.gguf");
        assert_eq!(
            file.settings.system.as_deref(),
            Some("You are terse.\nVery.")
        );
        assert_eq!(file.settings.parameters.len(), 3);
        assert_eq!(file.settings.parameters[0].as_f64(), Some(0.2));
        assert_eq!(
            file.settings.parameters[1].value,
            ParameterValue::Text("<|im_end|>".into())
        );
        assert_eq!(
            file.settings.parameters_text(),
            "temperature     0.2\nstop            \"<|im_end|>\"\nnum_predict     32\n"
        );
        let again = Modelfile::parse(&file.settings.modelfile("./m.gguf")).unwrap();
        assert_eq!(again, file);
    }

    #[test]
    fn a_template_is_jinja_or_a_name_never_a_path() {
        for fine in [
            "{{ messages }}",
            "{% for m in messages %}{% endfor %}",
            "chatml",
            "seed_oss",
        ] {
            let file = Modelfile::parse(&format!("FROM a\nTEMPLATE \"\"\"{fine}\"\"\"")).unwrap();
            assert_eq!(file.settings.template.as_deref(), Some(fine));
        }
        for path in ["/etc/hostname", "secret.txt", "../t.jinja", ""] {
            let error =
                Modelfile::parse(&format!("FROM a\nTEMPLATE \"\"\"{path}\"\"\"")).unwrap_err();
            assert_eq!(error.line, 2, "{path}");
            assert!(
                error.message.contains("neither a Jinja template"),
                "{error}"
            );
        }
    }

    #[test]
    fn mistakes_name_their_line() {
        for (text, expected) in [
            (
                "FROM a\nPARAMETER temprature 1",
                "Modelfile line 2: unknown parameter \"temprature\"",
            ),
            (
                "FROM a\nPARAMETER top_k many",
                "Modelfile line 2: top_k takes an integer, not \"many\"",
            ),
            (
                "FROM a\nADAPTER x",
                "Modelfile line 2: ADAPTER is not supported",
            ),
            ("SYSTEM hi", "Modelfile line 1: no FROM line"),
            (
                "FROM a\nSYSTEM \"\"\"open",
                "Modelfile line 2: a \"\"\" is never closed",
            ),
            ("FROM a\nFROM b", "Modelfile line 2: a second FROM"),
            (
                "FROM a\nRUN x",
                "Modelfile line 2: unknown instruction \"RUN\"",
            ),
        ] {
            let error = Modelfile::parse(text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{error}");
        }
    }

    #[test]
    fn newer_settings_win_by_name() {
        let base =
            Modelfile::parse("FROM a\nSYSTEM one\nPARAMETER temperature 1\nPARAMETER top_k 5")
                .unwrap();
        let newer = Modelfile::parse("FROM b\nPARAMETER temperature 0").unwrap();
        let merged = base.settings.overlaid(&newer.settings);
        assert_eq!(merged.system.as_deref(), Some("one"));
        let names: Vec<&str> = merged.parameters.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["top_k", "temperature"]);
        assert_eq!(merged.parameters[1].as_f64(), Some(0.0));
    }
}
