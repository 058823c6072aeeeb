//! A chat's output read as it is generated: each piece of text in, what
//! can be told of it out (answer text, thinking, calls written whole),
//! holding back what may yet turn out to be a marker (`<thi`, `<tool_ca`).
//! What is told is never taken back: the answer and thinking told are the
//! start of what the whole output's [`OutputSyntax::parse`] gives.

use cortex_request::ToolCall;

use crate::syntax::OutputSyntax;

/// What a piece of output adds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OutputDelta {
    /// More of the answer.
    pub content: String,
    /// More of the thinking.
    pub reasoning: String,
    /// Calls now written whole.
    pub calls: Vec<ToolCall>,
}

impl OutputDelta {
    /// Whether it adds nothing.
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty() && self.calls.is_empty()
    }
}

/// An output being read as it is generated.
#[derive(Debug, Clone)]
pub struct OutputStream {
    syntax: OutputSyntax,
    text: String,
    content: String,
    reasoning: String,
    calls: usize,
}

impl OutputStream {
    /// Reads an output of `syntax`.
    pub fn new(syntax: OutputSyntax) -> Self {
        Self {
            syntax,
            text: String::new(),
            content: String::new(),
            reasoning: String::new(),
            calls: 0,
        }
    }

    /// Takes more text; what can be told of it now.
    pub fn push(&mut self, text: &str) -> OutputDelta {
        self.text.push_str(text);
        if self.syntax.is_plain() {
            self.content.push_str(text);
            return OutputDelta {
                content: text.to_owned(),
                ..OutputDelta::default()
            };
        }
        let now = self.syntax.so_far(&self.text);
        self.delta(
            now.content,
            now.reasoning.unwrap_or_default(),
            now.tool_calls,
        )
    }

    /// The output has ended: the rest of it.
    pub fn finish(&mut self) -> OutputDelta {
        if self.syntax.is_plain() {
            return OutputDelta::default();
        }
        let whole = self.syntax.parse(&self.text);
        self.delta(
            whole.content,
            whole.reasoning.unwrap_or_default(),
            whole.tool_calls,
        )
    }

    fn delta(&mut self, content: String, reasoning: String, calls: Vec<ToolCall>) -> OutputDelta {
        let more = |told: &mut String, now: String| match now.strip_prefix(told.as_str()) {
            Some(rest) if !rest.is_empty() => {
                let rest = rest.to_owned();
                *told = now;
                rest
            }
            _ => String::new(),
        };
        let delta = OutputDelta {
            content: more(&mut self.content, content),
            reasoning: more(&mut self.reasoning, reasoning),
            calls: calls.into_iter().skip(self.calls).collect(),
        };
        self.calls += delta.calls.len();
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ChatTemplate, Conversation};
    use cortex_request::{ChatMessage, ToolChoice, Tools};

    /// Feeds `output` a few characters at a time; what was told, joined.
    fn told(stream: &mut OutputStream, output: &str) -> (String, String, Vec<String>) {
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        let chars: Vec<char> = output.chars().collect();
        let mut add = |delta: OutputDelta| {
            content += &delta.content;
            reasoning += &delta.reasoning;
            calls.extend(
                delta
                    .calls
                    .into_iter()
                    .map(|c| format!("{}{}", c.name, c.arguments)),
            );
        };
        for piece in chars.chunks(3) {
            add(stream.push(&piece.iter().collect::<String>()));
        }
        add(stream.finish());
        (content, reasoning, calls)
    }

    const HERMES_THINKING: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}";

    #[test]
    fn thinking_answer_and_calls_are_told_as_they_come_never_taken_back() {
        let template = ChatTemplate::new(HERMES_THINKING, "", "").unwrap();
        let tools = Tools {
            definitions: r#"[{"type": "function", "function": {"name": "f"}}]"#.into(),
            choice: ToolChoice::Auto,
            parallel: true,
        };
        let rendered = template
            .render_chat(&Conversation {
                messages: &[ChatMessage::user("hi")],
                tools: Some(&tools),
                variables: None,
            })
            .unwrap();
        let output = "Let me see.\n</think>\n\nSure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
        let mut stream = OutputStream::new(rendered.syntax.clone());
        let (content, reasoning, calls) = told(&mut stream, output);
        let whole = rendered.syntax.parse(output);
        assert_eq!(reasoning, whole.reasoning.unwrap());
        assert_eq!(content, whole.content);
        assert_eq!(content, "Sure.");
        assert_eq!(calls, [r#"f{"x":1}"#, "f{}"]);
    }

    #[test]
    fn plain_output_is_told_as_it_is() {
        let mut stream = OutputStream::new(OutputSyntax::plain());
        assert_eq!(told(&mut stream, "a <b> c").0, "a <b> c");
    }
}
