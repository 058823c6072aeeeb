//! The engine on a GGUF: three prompts submitted at once, generated
//! together in one batch (greedy, 24 tokens each), each answer printed
//! with its tokens and finish reason.
//!
//! ```text
//! cargo run --release -p cortex-llama --example generate [MODEL.gguf]
//! ```
//!
//! Without a file, the default model (SmolLM2-135M-Instruct) is used,
//! fetched once into cortex's model store.

use std::path::PathBuf;
use std::process::ExitCode;

use cortex_engine::{EngineConfig, EngineEvent};
use cortex_models::{BlobStore, DEFAULT_MODEL};
use cortex_request::{Request, RequestId, SamplingParams};

#[cfg_attr(test, allow(dead_code))]
fn main() -> ExitCode {
    let model = std::env::args().nth(1).map(PathBuf::from);
    match generate(model) {
        Ok(answers) => {
            for (prompt, answer) in answers {
                println!("{prompt}|{answer}\n");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("generate: {error}");
            ExitCode::FAILURE
        }
    }
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "Water boils at",
    "A short poem about the sea:\n",
];

/// Each prompt with its answer (and how it ended).
fn generate(model: Option<PathBuf>) -> Result<Vec<(String, String)>, Box<dyn std::error::Error>> {
    let model = match model {
        Some(path) => path,
        None => BlobStore::default_location().ensure(&DEFAULT_MODEL)?,
    };
    let engine = cortex_llama::start(&EngineConfig::new(model))?;
    let receivers = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, prompt)| {
            let mut request = Request::new(RequestId(i as u64), *prompt);
            request.sampling = SamplingParams::greedy();
            request.stop.max_tokens = 24;
            engine.submit(request)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut answers = Vec::new();
    for (prompt, events) in PROMPTS.iter().zip(receivers) {
        for event in &events {
            match event {
                EngineEvent::Finished(response) => {
                    let completion = &response.completions[0];
                    let answer = format!(
                        "{}\n  ({} tokens, {:?})",
                        completion.text,
                        completion.tokens.len(),
                        completion.finish_reason
                    );
                    answers.push(((*prompt).to_owned(), answer));
                    break;
                }
                EngineEvent::Failed { error, .. } => return Err(error.into()),
                _ => {}
            }
        }
    }
    Ok(answers)
}

#[cfg(test)]
mod tests {
    #[test]
    fn three_prompts_are_answered_together() {
        let answers = super::generate(None).unwrap();
        assert_eq!(answers.len(), 3);
        assert!(
            answers
                .iter()
                .all(|(_, a)| a.contains("(24 tokens, Length)")),
            "{answers:?}"
        );
    }
}
