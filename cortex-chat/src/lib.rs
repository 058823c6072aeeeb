//! Chat templates for cortex.
//!
//! A GGUF carries its model's chat template as Jinja source
//! (`tokenizer.chat_template`, the one Hugging Face's `transformers`
//! renders). [`ChatTemplate`] renders it with [`minijinja`] the way
//! `transformers` does (blocks trimmed, Python string methods, loop
//! controls, `raise_exception`, `strftime_now`): messages with their tool
//! calls and tool results, the `tools` on offer, `add_generation_prompt`,
//! `bos_token` and `eos_token`. [`parse_tool_calls`] reads the function
//! calls back out of what a model generated (Hermes `<tool_call>` blocks,
//! Mistral's `[TOOL_CALLS]`, or a bare JSON call).
//!
//! No I/O, no llama.cpp: the engine hands it the template's text.
//!
//! # Example
//!
//! ```
//! use cortex_chat::{ChatTemplate, Conversation, parse_tool_calls};
//! use cortex_request::ChatMessage;
//!
//! let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content | trim }}\n{% endfor %}\
//!               {% if add_generation_prompt %}<|assistant|>{% endif %}";
//! let template = ChatTemplate::new(source, "<s>", "</s>")?;
//! let messages = [ChatMessage::user("  Hi!  ")];
//! let prompt = template.render(&Conversation::new(&messages), true)?;
//! assert_eq!(prompt, "<|user|>Hi!\n<|assistant|>");
//! assert!(!template.takes_tools());
//!
//! let (text, calls) = parse_tool_calls(
//!     "Let me look.<tool_call>\n{\"name\": \"weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>",
//! )
//! .unwrap();
//! assert_eq!((text.as_str(), calls[0].name.as_str()), ("Let me look.", "weather"));
//! assert_eq!(calls[0].arguments, r#"{"city":"Oslo"}"#);
//! # Ok::<(), cortex_chat::TemplateError>(())
//! ```
//!
//! # Design notes
//!
//! Chat templates. `ChatTemplate` compiles a GGUF's Jinja `tokenizer.chat_template`
//! with minijinja, set up as `transformers` renders it (trim_blocks and
//! lstrip_blocks, Python string methods through minijinja-contrib's pycompat,
//! loop controls, `raise_exception`, `strftime_now`, `tojson` keeping key order),
//! and renders messages (as Hugging Face's shape: `tool_calls` with arguments as
//! objects, `tool_call_id`, present only when set, since templates test
//! `is defined`), `tools`, `add_generation_prompt`, `bos_token` and
//! `eos_token`. `takes_tools` is whether the template reads `tools` at all;
//! offering tools to one that does not is an error, never a silent drop.
//! `parse_tool_calls` reads calls out of generated text (Hermes `<tool_call>`
//! blocks, Mistral `[TOOL_CALLS]`, a bare JSON call or array, `arguments` or
//! `parameters`); text that holds none is an ordinary answer. No I/O.

#![forbid(unsafe_code)]

mod calls;
mod capabilities;
mod conversation;
mod native;
mod open_calls;
mod python;
mod python_calls;
mod render;
mod stream;
mod syntax;
mod template;

pub use calls::parse_tool_calls;
pub use conversation::Conversation;
pub use render::{Adaptations, RenderedChat, TextOnlyChat};
pub use stream::{OutputDelta, OutputStream};
pub use syntax::{OutputSyntax, ParsedOutput};
pub use template::{ChatTemplate, TemplateError};
