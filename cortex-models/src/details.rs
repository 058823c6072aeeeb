//! What a GGUF says about its model, in the terms people compare models by
//! (Ollama's `details` and `model_info`).

use std::collections::BTreeMap;

use crate::{GgufInfo, GgufValue};

/// A model's facts, read from its GGUF header.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ModelDetails {
    /// `general.architecture` (`llama`, `gemma3`, ...).
    pub family: Option<String>,
    /// `general.name`, as its makers named it.
    pub model_name: Option<String>,
    /// Parameters, counted from the tensors.
    pub parameter_count: u64,
    /// The same, as people write it (`135M`, `1.2B`).
    pub parameter_size: String,
    /// `Q4_1`, `Q4_K_M`, ...
    pub quantization: Option<&'static str>,
    /// The context length it was trained with.
    pub context_length: Option<u64>,
    /// The width of its hidden state.
    pub embedding_length: Option<u64>,
    /// The chat template it carries, if any.
    pub chat_template: Option<String>,
    /// The file's size in bytes.
    pub file_size: u64,
    /// GGUF format version.
    pub gguf_version: u32,
    /// Number of tensors.
    pub tensors: u64,
}

impl ModelDetails {
    /// The facts of a header read with [`crate::read_gguf`].
    pub fn of(info: &GgufInfo) -> Self {
        let family = info.architecture().map(str::to_owned);
        let per_family = |key: &str| {
            family
                .as_deref()
                .and_then(|arch| info.uint(&format!("{arch}.{key}")))
        };
        Self {
            model_name: info.string("general.name").map(str::to_owned),
            parameter_count: info.parameters,
            parameter_size: parameter_size(info.parameters),
            quantization: info.quantisation(),
            context_length: per_family("context_length"),
            embedding_length: per_family("embedding_length"),
            chat_template: info.string("tokenizer.chat_template").map(str::to_owned),
            file_size: info.file_size,
            gguf_version: info.version,
            tensors: info.tensor_count,
            family,
        }
    }
}

/// `135M`, `1.2B`: a parameter count as model names give it.
pub fn parameter_size(count: u64) -> String {
    let count = count as f64;
    let (value, unit) = if count >= 1e9 {
        (count / 1e9, "B")
    } else if count >= 1e6 {
        (count / 1e6, "M")
    } else {
        (count / 1e3, "K")
    };
    if value >= 100.0 {
        format!("{value:.0}{unit}")
    } else {
        format!("{value:.1}{unit}")
    }
}

/// The header's scalar metadata as JSON (Ollama's `model_info`); arrays are
/// left out but for their lengths, the chat template is given apart.
pub fn model_info(info: &GgufInfo) -> BTreeMap<String, serde_json::Value> {
    let mut facts = BTreeMap::new();
    for (key, value) in &info.metadata {
        if key == "tokenizer.chat_template" {
            continue;
        }
        let json = match value {
            GgufValue::Uint(v) => serde_json::json!(v),
            GgufValue::Int(v) => serde_json::json!(v),
            GgufValue::Float(v) => serde_json::json!(v),
            GgufValue::Bool(v) => serde_json::json!(v),
            GgufValue::String(v) => serde_json::json!(v),
            GgufValue::Array { len, .. } => serde_json::json!(len),
        };
        facts.insert(key.clone(), json);
    }
    facts.insert(
        "general.parameter_count".into(),
        serde_json::json!(info.parameters),
    );
    facts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(268_098_176), "268M");
        assert_eq!(parameter_size(1_235_814_400), "1.2B");
        assert_eq!(parameter_size(7_000_000_000), "7.0B");
        assert_eq!(parameter_size(42_000), "42.0K");
    }
}
