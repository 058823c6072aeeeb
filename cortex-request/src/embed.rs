//! Embedding requests, and the one type a queued item asks for: a
//! generation ([`Request`]) or embeddings ([`EmbeddingRequest`]).

use crate::{Prompt, Request, RequestId};

/// Embeddings of one or more inputs (text or token ids), one vector each,
/// in input order.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct EmbeddingRequest {
    /// Who asked (echoed in the response).
    pub id: RequestId,
    /// The inputs; chats are not embedded (`Prompt::Chat` is refused).
    pub inputs: Vec<Prompt>,
}

impl EmbeddingRequest {
    /// Most inputs in one request (OpenAI's limit for one call).
    pub const MAX_INPUTS: usize = 2048;

    /// A request for the embeddings of `inputs`.
    pub fn new(id: RequestId, inputs: Vec<Prompt>) -> Self {
        Self { id, inputs }
    }

    /// Checks the inputs: at least one, at most [`Self::MAX_INPUTS`], none
    /// empty, no chats. The message names the input by index.
    pub fn validate(&self) -> Result<(), EmbedInputError> {
        if self.inputs.is_empty() {
            return Err(EmbedInputError::NoInput);
        }
        if self.inputs.len() > Self::MAX_INPUTS {
            return Err(EmbedInputError::TooMany {
                count: self.inputs.len(),
                max: Self::MAX_INPUTS,
            });
        }
        for (index, input) in self.inputs.iter().enumerate() {
            match input {
                Prompt::Chat(_) => return Err(EmbedInputError::Chat { index }),
                Prompt::Several(_) => return Err(EmbedInputError::Several { index }),
                Prompt::Text(_) | Prompt::Tokens(_) => {}
            }
            if input.is_empty() {
                return Err(EmbedInputError::Empty { index });
            }
        }
        Ok(())
    }
}

/// What is wrong with an embedding request's inputs (each names the input
/// by index).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmbedInputError {
    /// No input at all.
    #[error("input is empty: give at least one text")]
    NoInput,
    /// More inputs than one request takes.
    #[error("input has {count} entries; at most {max} per request")]
    TooMany {
        /// How many were given.
        count: usize,
        /// How many a request takes.
        max: usize,
    },
    /// A chat, where a text or token ids go.
    #[error("input[{index}] is a chat; embeddings take text or token ids")]
    Chat {
        /// Which input.
        index: usize,
    },
    /// A list of prompts, where one goes.
    #[error(
        "input[{index}] is a list of prompts; embeddings take one text or token list per input"
    )]
    Several {
        /// Which input.
        index: usize,
    },
    /// An empty text or token list.
    #[error("input[{index}] is empty")]
    Empty {
        /// Which input.
        index: usize,
    },
}

/// What one queued item asks for.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
// Nearly every item is a generation; boxing it would cost an allocation
// per request to save bytes on the rare embedding.
#[allow(clippy::large_enum_variant)]
pub enum Work {
    /// Generate completions.
    Generate(Request),
    /// Compute embeddings.
    Embed(EmbeddingRequest),
}

impl Work {
    /// The request's id.
    pub fn id(&self) -> RequestId {
        match self {
            Work::Generate(request) => request.id,
            Work::Embed(request) => request.id,
        }
    }

    /// Sets the request's id.
    pub fn set_id(&mut self, id: RequestId) {
        match self {
            Work::Generate(request) => request.id = id,
            Work::Embed(request) => request.id = id,
        }
    }

    /// The generation request, if this is one.
    pub fn as_generate(&self) -> Option<&Request> {
        match self {
            Work::Generate(request) => Some(request),
            Work::Embed(_) => None,
        }
    }
}

impl From<Request> for Work {
    fn from(request: Request) -> Self {
        Work::Generate(request)
    }
}

impl From<EmbeddingRequest> for Work {
    fn from(request: EmbeddingRequest) -> Self {
        Work::Embed(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_input() {
        let ok = EmbeddingRequest::new(RequestId(1), vec!["a".into(), vec![1, 2].into()]);
        assert_eq!(ok.validate(), Ok(()));
        let empty = EmbeddingRequest::new(RequestId(1), vec!["a".into(), "".into()]);
        assert_eq!(empty.validate(), Err(EmbedInputError::Empty { index: 1 }));
        let none = EmbeddingRequest::new(RequestId(1), vec![]);
        assert_eq!(none.validate(), Err(EmbedInputError::NoInput));
        let chat = EmbeddingRequest::new(
            RequestId(1),
            vec![Prompt::Chat(vec![crate::ChatMessage::user("x")])],
        );
        let error = chat.validate().unwrap_err();
        assert_eq!(error, EmbedInputError::Chat { index: 0 });
        assert!(error.to_string().starts_with("input[0] is a chat"));
    }
}
