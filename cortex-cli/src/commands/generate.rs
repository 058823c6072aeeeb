//! `cortex generate`: one prompt straight through the engine, streamed to
//! the terminal, optionally constrained by a grammar or JSON schema.

use std::io::Write;
use std::path::Path;

use anyhow::{Context as _, bail};
use cortex_engine::{EngineEvent, Shutdown};
use cortex_request::{ChatMessage, Prompt, Request, RequestId};

use crate::cli::GenerateArgs;
use crate::config::Config;
use crate::output;

/// The grammar `generate` constrains its output with, from `--json-schema`
/// or `--grammar`, checked before the model loads.
fn generation_grammar(args: &GenerateArgs) -> anyhow::Result<Option<String>> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
    };
    if let Some(path) = &args.json_schema {
        let schema: serde_json::Value = serde_json::from_str(&read(path)?)
            .with_context(|| format!("{}: not JSON", path.display()))?;
        let grammar = cortex_grammar::from_json_schema(&schema)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        return Ok(Some(grammar));
    }
    if let Some(path) = &args.grammar {
        let grammar = read(path)?;
        cortex_grammar::check(&grammar).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        return Ok(Some(grammar));
    }
    Ok(None)
}

/// The prompt as given, or stdin's whole text for `-` (`echo hi | cortex generate -`).
fn prompt_text(given: &str) -> anyhow::Result<String> {
    if given != "-" {
        return Ok(given.to_owned());
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
        .map_err(|e| anyhow::anyhow!("cannot read the prompt from stdin: {e}"))?;
    // A shell's `echo` or a file ends with a newline that is not part of the prompt.
    let text = text.strip_suffix('\n').unwrap_or(&text);
    if text.trim().is_empty() {
        bail!("the prompt read from stdin (`-`) is empty");
    }
    Ok(text.to_owned())
}

pub(crate) fn generate(config: &Config, args: &GenerateArgs) -> anyhow::Result<()> {
    let prompt_text = prompt_text(&args.prompt)?;
    let model = config.resolve_model()?;
    let engine = cortex_llama::start(&config.one_prompt_engine_config(&model))?;
    // A registered model's SYSTEM and PARAMETERs, under the flags.
    let defaults = cortex_worker::model_defaults(&model.settings);
    let prompt = if args.chat {
        let mut messages: Vec<ChatMessage> =
            defaults.system.iter().map(ChatMessage::system).collect();
        messages.push(ChatMessage::user(&prompt_text));
        Prompt::Chat(messages)
    } else {
        Prompt::Text(prompt_text)
    };
    let mut request = Request::new(RequestId(1), prompt);
    request.sampling = defaults.sampling;
    request.stop = defaults.stop;
    args.request.apply(&mut request.sampling, &mut request.stop);
    request.grammar = generation_grammar(args)?;
    request.validate(&cortex_request::Limits::default())?;
    let events = engine.submit(request)?;
    let mut stdout = std::io::stdout().lock();
    for event in &events {
        match event {
            EngineEvent::Token { text, .. } => {
                // A closed pipe (`| head`) ends the command quietly.
                stdout
                    .write_all(text.as_bytes())
                    .and_then(|()| stdout.flush())
                    .map_err(output::stdout_error)?;
            }
            EngineEvent::Finished(response) => {
                writeln!(stdout).map_err(output::stdout_error)?;
                let u = &response.usage;
                let speed = response
                    .timings
                    .decode_tokens_per_second(u.completion_tokens)
                    .unwrap_or(0.0);
                let reason = response
                    .completions
                    .first()
                    .map_or("stop", |c| c.finish_reason.as_str());
                eprintln!(
                    "[{} prompt + {} generated tokens, {speed:.0} tokens/s, finished: {reason}]",
                    u.prompt_tokens, u.completion_tokens
                );
                break;
            }
            EngineEvent::Failed { error, .. } => return Err(error.into()),
            _ => {}
        }
    }
    engine.shutdown(Shutdown::Abort)?;
    Ok(())
}
