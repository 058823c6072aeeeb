//! How chats become prompt text: a Jinja template (the GGUF's own, or a
//! file given with `--chat-template`) rendered by `cortex-chat` as
//! `transformers` renders it, or a template llama.cpp knows by name
//! rendered by llama.cpp itself.

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;

use cortex_chat::{ChatTemplate, Conversation, RenderedChat, TemplateError, TextOnlyChat};
use cortex_engine::{EngineError, ExecutorError};
use cortex_models::is_jinja;
use cortex_request::ChatTemplateChoice;

use crate::Model;
use crate::sys;

/// What renders a model's chats.
#[derive(Debug)]
pub(crate) enum ChatRenderer {
    /// A Jinja template.
    Jinja {
        // One per backend: boxing saves nothing worth an indirection.
        template: Box<ChatTemplate>,
        /// The model's start-token text, dropped from the front of the
        /// rendered text when tokenizing adds it anyway.
        strip_bos: Option<String>,
    },
    /// A name llama.cpp renders (`chatml`, `gemma`, ...), or a GGUF
    /// template minijinja cannot compile, left to llama.cpp's matcher.
    Builtin(String),
    /// The GGUF has no template and none was chosen.
    Missing,
}

impl ChatRenderer {
    /// The renderer for `model`: `setting` (a name llama.cpp knows, or a
    /// template's text) or else the GGUF's own template.
    pub(crate) fn new(model: &Model, setting: Option<&str>) -> Result<Self, ExecutorError> {
        let names = chat_template_names();
        match setting {
            Some(name) if names.iter().any(|n| n == name) => Ok(Self::Builtin(name.to_owned())),
            Some(text) => Self::jinja(model, text)
                .map_err(|e| ExecutorError::Failed(format!("chat template: {e}"))),
            None => match model.raw.chat_template() {
                None => Ok(Self::Missing),
                Some(source) => Ok(Self::jinja(model, &source).unwrap_or_else(|e| {
                    tracing::warn!(
                        "the GGUF's chat template is rendered by llama.cpp's matcher: {e}"
                    );
                    Self::Builtin(source)
                })),
            },
        }
    }

    fn jinja(model: &Model, source: &str) -> Result<Self, TemplateError> {
        let (bos, eos) = model.raw.bos_eos_text();
        let template = ChatTemplate::new(source, &bos, &eos)?;
        let strip_bos = (model.raw.adds_bos() && !bos.is_empty()).then_some(bos);
        Ok(Self::Jinja {
            template: Box::new(template),
            strip_bos,
        })
    }

    /// Renders `conversation` for generation: the prompt, how its output
    /// is read, the grammar its tools ask for.
    pub(crate) fn render(
        &self,
        conversation: &Conversation<'_>,
    ) -> Result<RenderedChat, ExecutorError> {
        match self {
            Self::Jinja {
                template,
                strip_bos,
            } => {
                let mut rendered = template
                    .render_chat(conversation)
                    .map_err(|e| ExecutorError::Failed(e.to_string()))?;
                if let Some(rest) = strip_bos
                    .as_deref()
                    .and_then(|b| rendered.prompt.strip_prefix(b))
                {
                    rendered.prompt = rest.to_owned();
                }
                Ok(rendered)
            }
            Self::Builtin(template) => {
                // llama.cpp renders roles and text only: tools and earlier
                // calls go in as cortex's generic text, as for a Jinja
                // template that does not render them.
                let chat = TextOnlyChat::new(conversation)
                    .map_err(|e| ExecutorError::Failed(e.to_string()))?;
                let pairs: Vec<(&str, &str)> = chat
                    .messages
                    .iter()
                    .map(|m| (m.role.as_str(), m.content.as_str()))
                    .collect();
                let prompt = sys::apply_chat_template(template, &pairs, true)
                    .map_err(|e| ExecutorError::Failed(format!("chat template: {e}")))?;
                Ok(RenderedChat {
                    prompt,
                    syntax: chat.syntax,
                    grammar: chat.grammar,
                })
            }
            Self::Missing => Err(ExecutorError::Failed(
                "the model has no chat template of its own; choose one with --chat-template (e.g. chatml, gemma, llama3, or a Jinja file)".into(),
            )),
        }
    }
}

/// Templates besides its own an executor keeps compiled: a server's names
/// that share weights with different templates are few.
const MAX_OTHER_TEMPLATES: usize = 8;

/// An executor's chat renderers: the one its engine was started with, and
/// those requests chose instead (a registered model's template, where two
/// names share their weights and so one engine), each compiled once.
#[derive(Debug)]
pub(crate) struct ChatRenderers {
    /// The template the engine was started with (`None`: the model file's).
    own_setting: Option<String>,
    own: ChatRenderer,
    /// Setting and renderer, the most recently made last.
    others: RefCell<Vec<(Option<Arc<str>>, ChatRenderer)>>,
}

impl ChatRenderers {
    /// `own` renders what `own_setting` (a template's text or a name; `None`:
    /// the model file's own) names.
    pub(crate) fn new(own: ChatRenderer, own_setting: Option<String>) -> Self {
        Self {
            own_setting,
            own,
            others: RefCell::new(Vec::new()),
        }
    }

    /// Renders `conversation` with the template `choice` names.
    pub(crate) fn render(
        &self,
        model: &Model,
        conversation: &Conversation<'_>,
        choice: &ChatTemplateChoice,
    ) -> Result<RenderedChat, ExecutorError> {
        let setting = match choice {
            ChatTemplateChoice::Engine => return self.own.render(conversation),
            ChatTemplateChoice::ModelFile => None,
            ChatTemplateChoice::Given(text) => Some(&**text),
        };
        if setting == self.own_setting.as_deref() {
            return self.own.render(conversation);
        }
        let mut others = self.others.borrow_mut();
        let at = match others.iter().position(|(s, _)| s.as_deref() == setting) {
            Some(at) => at,
            None => {
                // As the engine's start does with a registered TEMPLATE
                // that is neither (one made before such were refused).
                let usable = setting.filter(|text| match check_chat_template_text(text) {
                    Ok(()) => true,
                    Err(why) => {
                        tracing::warn!("the model file's own chat template renders instead: {why}");
                        false
                    }
                });
                let renderer = ChatRenderer::new(model, usable)?;
                if others.len() == MAX_OTHER_TEMPLATES {
                    others.remove(0);
                }
                others.push((setting.map(Arc::from), renderer));
                others.len() - 1
            }
        };
        others[at].1.render(conversation)
    }
}

/// Whether `text` is a chat template a client may give (a request's, a
/// registered model's `TEMPLATE`): a Jinja template's text or a name
/// llama.cpp knows, never a file to read, as the `--chat-template` setting
/// of whoever runs cortex may be.
pub fn check_chat_template_text(text: &str) -> Result<(), String> {
    if is_jinja(text) || chat_template_names().iter().any(|n| n == text) {
        return Ok(());
    }
    Err(format!(
        "chat template {:?} is neither a Jinja template nor a template llama.cpp knows ({})",
        text.chars().take(80).collect::<String>(),
        chat_template_names().join(", ")
    ))
}

/// The names of the chat templates llama.cpp renders itself, for
/// `EngineConfig::chat_template`.
pub(crate) fn chat_template_names() -> Vec<String> {
    sys::builtin_chat_templates()
}

/// The template a chat-template setting stands for: the text of the file it
/// names, a name llama.cpp knows, or a template's own text (a registered
/// model's `TEMPLATE`; Jinja always holds `{{` or `{%`).
pub(crate) fn resolve_chat_template(setting: &str) -> Result<String, EngineError> {
    if is_jinja(setting) {
        return Ok(setting.to_owned());
    }
    let path = Path::new(setting);
    if path.is_file() {
        return std::fs::read_to_string(path)
            .map_err(|e| EngineError::Model(format!("chat template {}: {e}", path.display())));
    }
    let names = chat_template_names();
    if names.iter().any(|n| n == setting) {
        return Ok(setting.to_owned());
    }
    Err(EngineError::Model(format!(
        "chat template {setting:?} is neither a file nor a template llama.cpp knows ({})",
        names.join(", ")
    )))
}
