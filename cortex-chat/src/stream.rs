//! A chat's output read as it is generated: each piece of text in, what
//! can be told of it out (answer text, thinking, calls as they are
//! written: a call's name once whole, then its arguments piece by piece),
//! holding back what may yet turn out to be a marker (`<thi`, `<tool_ca`).
//! What is told is never taken back: the answer and thinking told are the
//! start of what the whole output's [`OutputSyntax::parse`] gives.

use cortex_request::{ToolCall, ToolCallDelta};

use crate::open_calls::CallSoFar;
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
    /// The calls' pieces written now: each call's name once whole, then
    /// its arguments as they come (ending with the call's end or the
    /// output's).
    pub call_pieces: Vec<ToolCallDelta>,
}

impl OutputDelta {
    /// Whether it adds nothing.
    pub fn is_empty(&self) -> bool {
        self.content.is_empty()
            && self.reasoning.is_empty()
            && self.calls.is_empty()
            && self.call_pieces.is_empty()
    }

    /// Adds `later` to what this one tells.
    pub fn extend(&mut self, later: OutputDelta) {
        self.content.push_str(&later.content);
        self.reasoning.push_str(&later.reasoning);
        self.calls.extend(later.calls);
        self.call_pieces.extend(later.call_pieces);
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
    /// Each call's arguments told so far (a call here has its name told).
    told_arguments: Vec<String>,
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
            told_arguments: Vec::new(),
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
        let (now, open) = self.syntax.so_far(&self.text);
        self.delta(
            now.content,
            now.reasoning.unwrap_or_default(),
            now.tool_calls,
            open.as_ref(),
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
            None,
        )
    }

    fn delta(
        &mut self,
        content: String,
        reasoning: String,
        calls: Vec<ToolCall>,
        open: Option<&CallSoFar>,
    ) -> OutputDelta {
        let more = |told: &mut String, now: String| match now.strip_prefix(told.as_str()) {
            Some(rest) if !rest.is_empty() => {
                let rest = rest.to_owned();
                *told = now;
                rest
            }
            _ => String::new(),
        };
        let mut call_pieces = Vec::new();
        let written = calls
            .iter()
            .map(|call| (call.name.as_str(), call.arguments.as_str()))
            .chain(
                open.as_ref()
                    .and_then(|open| Some((open.name.as_deref()?, open.arguments.as_str()))),
            );
        for (index, (name, arguments)) in written.enumerate() {
            match self.told_arguments.get_mut(index) {
                None => {
                    call_pieces.push(ToolCallDelta {
                        index,
                        name: Some(name.to_owned()),
                        arguments: arguments.to_owned(),
                    });
                    self.told_arguments.push(arguments.to_owned());
                }
                Some(told) => {
                    // Arguments read so far are the start of the whole
                    // call's (see `open_calls`); only more is told.
                    if let Some(rest) = arguments.strip_prefix(told.as_str())
                        && !rest.is_empty()
                    {
                        call_pieces.push(ToolCallDelta {
                            index,
                            name: None,
                            arguments: rest.to_owned(),
                        });
                        told.push_str(rest);
                    }
                }
            }
        }
        let delta = OutputDelta {
            content: more(&mut self.content, content),
            reasoning: more(&mut self.reasoning, reasoning),
            calls: calls.into_iter().skip(self.calls).collect(),
            call_pieces,
        };
        self.calls += delta.calls.len();
        delta
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::CallSyntax;
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

    /// Feeds `output` a few characters at a time, then ends it: the
    /// content told, and each call's name with the pieces of its arguments.
    fn pieces(syntax: &OutputSyntax, output: &str) -> (String, Vec<(String, Vec<String>)>) {
        let mut stream = OutputStream::new(syntax.clone());
        let mut told = OutputDelta::default();
        let chars: Vec<char> = output.chars().collect();
        for piece in chars.chunks(3) {
            told.extend(stream.push(&piece.iter().collect::<String>()));
        }
        told.extend(stream.finish());
        let mut calls: Vec<(String, Vec<String>)> = Vec::new();
        for piece in told.call_pieces {
            match piece.name {
                Some(name) => {
                    assert_eq!(piece.index, calls.len(), "calls open in order");
                    calls.push((name, vec![piece.arguments]));
                }
                None => calls[piece.index].1.push(piece.arguments),
            }
        }
        (told.content, calls)
    }

    #[test]
    fn calls_are_told_name_first_then_their_arguments_piece_by_piece_in_every_form() {
        let arguments =
            r#"{"city": "Lisbon", "unit": "celsius", "days": 3, "note": "a \"quoted\" word"}"#;
        let canonical = serde_json::from_str::<serde_json::Value>(arguments)
            .unwrap()
            .to_string();
        let syntax = |calls| OutputSyntax {
            calls,
            ..OutputSyntax::default()
        };
        let hermes = format!(
            "Checking.\n<tool_call>\n{{\"name\": \"get_weather\", \"arguments\": {arguments}}}\n</tool_call>"
        );
        let forms = [
            (
                "hermes",
                syntax(CallSyntax::Native(None)),
                hermes,
                "Checking.",
            ),
            (
                "bare JSON",
                syntax(CallSyntax::Native(None)),
                format!("{{\"name\": \"get_weather\", \"parameters\": {arguments}}}"),
                "",
            ),
            (
                "cortex's envelope",
                syntax(CallSyntax::Generic),
                format!(
                    "{{\"tool_calls\": [{{\"name\": \"get_weather\", \"arguments\": {arguments}}}]}}"
                ),
                "",
            ),
            (
                "gpt-oss's channels",
                syntax(CallSyntax::Channels),
                format!(
                    "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{canonical}<|call|>"
                ),
                "",
            ),
            (
                "gpt-oss's forced JSON",
                syntax(CallSyntax::Channels),
                format!("{{\"name\": \"get_weather\", \"arguments\": {arguments}}}"),
                "",
            ),
        ];
        for (form, syntax, output, content) in forms {
            let whole = syntax.parse(&output);
            let (told, calls) = pieces(&syntax, &output);
            assert_eq!(
                (told.as_str(), whole.content.as_str()),
                (content, content),
                "{form}"
            );
            assert_eq!(calls.len(), 1, "{form}");
            let (name, arguments) = &calls[0];
            assert_eq!(name, "get_weather", "{form}");
            assert!(arguments.len() >= 3, "{form}: {arguments:?}");
            assert_eq!(arguments.concat(), whole.tool_calls[0].arguments, "{form}");
            assert_eq!(whole.tool_calls[0].arguments, canonical, "{form}");
            // Cut short: still the call, its arguments as far as they went.
            let cut = &output[..output.find("celsius").unwrap()];
            let parsed = syntax.parse(cut);
            assert_eq!(parsed.content, content, "{form} cut");
            assert_eq!(parsed.tool_calls.len(), 1, "{form} cut");
            assert!(
                canonical.starts_with(&parsed.tool_calls[0].arguments),
                "{form} cut"
            );
            let (_, cut_calls) = pieces(&syntax, cut);
            assert_eq!(
                cut_calls[0].1.concat(),
                parsed.tool_calls[0].arguments,
                "{form} cut"
            );
        }
    }

    #[test]
    fn plain_output_is_told_as_it_is() {
        let mut stream = OutputStream::new(OutputSyntax::plain());
        assert_eq!(told(&mut stream, "a <b> c").0, "a <b> c");
    }
}
