//! The life of a request and why a completion ended.

use std::fmt;

/// Why a completion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum FinishReason {
    /// A stop string or stop token id matched.
    Stop,
    /// `max_tokens` were generated (or the context filled up).
    Length,
    /// The model produced an end-of-generation token.
    Eos,
    /// The caller cancelled the request.
    Cancelled,
    /// The request failed.
    Error,
}

impl FinishReason {
    /// The `finish_reason` string of the OpenAI API (which reports EOS as `stop`).
    pub fn as_openai(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Eos => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }

    /// This reason's own name (`eos` stays `eos`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Eos => "eos",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Error => "error",
        }
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a request is in its life.
///
/// ```text
/// Pending ──► Prefilling ──► Decoding ──► Finished
///    ▲            │  │           │  │
///    └────────────┘  │           │  └──► (preempted) Pending
///   (preempted)      ▼           ▼
///           Failed / Cancelled (from any live state)
/// ```
///
/// A request may finish straight from `Prefilling` because the token sampled at
/// the end of its prompt can already end it (EOS, `max_tokens` = 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum RequestState {
    /// Waiting to be scheduled (or preempted and waiting to be recomputed).
    #[default]
    Pending,
    /// Its prompt is being computed.
    Prefilling,
    /// Generating tokens.
    Decoding,
    /// Ended normally.
    Finished,
    /// Ended with an error.
    Failed,
    /// Ended by the caller.
    Cancelled,
}

/// A state change the lifecycle does not allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("illegal request state transition {from:?} -> {to:?}")]
pub struct InvalidTransition {
    /// The state the request was in.
    pub from: RequestState,
    /// The state it was asked to move to.
    pub to: RequestState,
}

impl RequestState {
    /// Whether the request has ended (no transition leaves this state).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RequestState::Finished | RequestState::Failed | RequestState::Cancelled
        )
    }

    /// Whether `self -> to` is a legal move.
    pub fn can_transition_to(self, to: RequestState) -> bool {
        use RequestState::*;
        match (self, to) {
            (from, _) if from.is_terminal() => false,
            (_, Failed | Cancelled) => true,
            (Pending, Prefilling) => true,
            (Prefilling, Decoding | Finished | Pending) => true,
            (Decoding, Finished | Pending) => true,
            _ => false,
        }
    }

    /// Moves to `to` if the lifecycle allows it; otherwise leaves `self` unchanged.
    pub fn transition(&mut self, to: RequestState) -> Result<(), InvalidTransition> {
        if self.can_transition_to(to) {
            *self = to;
            Ok(())
        } else {
            Err(InvalidTransition { from: *self, to })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RequestState::{self, *};

    const ALL: [RequestState; 6] = [Pending, Prefilling, Decoding, Finished, Failed, Cancelled];

    #[test]
    fn legal_transitions_are_exactly_the_lifecycle() {
        let legal = [
            (Pending, Prefilling),
            (Pending, Failed),
            (Pending, Cancelled),
            (Prefilling, Decoding),
            (Prefilling, Finished),
            (Prefilling, Pending),
            (Prefilling, Failed),
            (Prefilling, Cancelled),
            (Decoding, Finished),
            (Decoding, Pending),
            (Decoding, Failed),
            (Decoding, Cancelled),
        ];
        for from in ALL {
            for to in ALL {
                let expected = legal.contains(&(from, to));
                assert_eq!(from.can_transition_to(to), expected, "{from:?} -> {to:?}");
                let mut state = from;
                assert_eq!(state.transition(to).is_ok(), expected);
                assert_eq!(state, if expected { to } else { from });
            }
        }
    }

    #[test]
    fn terminal_states_are_final() {
        for state in [Finished, Failed, Cancelled] {
            assert!(state.is_terminal());
            assert!(ALL.iter().all(|&to| !state.can_transition_to(to)));
        }
    }
}
