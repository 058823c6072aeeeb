//! What the scheduler decides for one step.

use std::fmt;

use cortex_request::RequestId;

/// Part of a prompt to compute in this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillChunk {
    /// The request.
    pub id: RequestId,
    /// Position of the chunk's first token.
    pub start: usize,
    /// Tokens in the chunk.
    pub len: usize,
    /// Whether this chunk ends the prompt, so its last token's logits are sampled.
    pub samples: bool,
}

/// A request admitted in this step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Admission {
    /// The request.
    pub id: RequestId,
    /// Leading tokens whose KV came from the prefix cache (not computed again).
    pub cached_tokens: usize,
}

/// Why admission of waiting requests stopped in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionStop {
    /// Nothing is waiting (or everything waiting was deferred).
    QueueEmpty,
    /// The step's token budget is used up.
    BudgetExhausted,
    /// `max_running` sequences are running.
    MaxRunning,
    /// Requests join on another step (see `SchedConfig::admit_every`).
    Cadence,
    /// The request at the head of the queue does not fit in the KV pool.
    KvFull {
        /// The request that did not fit.
        id: RequestId,
        /// Blocks it needs (prompt plus headroom).
        needed: usize,
        /// Blocks free or evictable.
        available: usize,
    },
}

/// What one step computes, and why it looks the way it does.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepPlan {
    /// Step number, from 1.
    pub step: u64,
    /// Requests decoding one token each (their last token is fed).
    pub decode: Vec<RequestId>,
    /// Prompt chunks to compute.
    pub prefill: Vec<PrefillChunk>,
    /// Requests admitted from the waiting queue in this step.
    pub admitted: Vec<Admission>,
    /// Requests preempted in this step to free KV blocks; they will be recomputed.
    pub preempted: Vec<RequestId>,
    /// Waiting requests held back because a prefix they share is being computed.
    pub deferred: Vec<RequestId>,
    /// Why admission stopped.
    pub admission_stop: Option<AdmissionStop>,
}

impl StepPlan {
    /// Tokens the step computes.
    pub fn num_tokens(&self) -> usize {
        self.decode.len() + self.prefill.iter().map(|c| c.len).sum::<usize>()
    }

    /// Rows that produce a sampled token.
    pub fn num_samples(&self) -> usize {
        self.decode.len() + self.prefill.iter().filter(|c| c.samples).count()
    }

    /// Whether there is nothing to compute.
    pub fn is_empty(&self) -> bool {
        self.decode.is_empty() && self.prefill.is_empty()
    }
}

fn ids(f: &mut fmt::Formatter<'_>, label: &str, ids: &[RequestId]) -> fmt::Result {
    if ids.is_empty() {
        return Ok(());
    }
    write!(f, " {label}[")?;
    for (i, id) in ids.iter().enumerate() {
        write!(f, "{}{}", if i > 0 { " " } else { "" }, id.0)?;
    }
    write!(f, "]")
}

/// One line: `step 3: decode[1 2] prefill[4@0+16* 5@0+8] admitted[4 5(cached 32)] | kv full for 6 (need 3, have 1)`.
impl fmt::Display for StepPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}:", self.step)?;
        ids(f, "decode", &self.decode)?;
        if !self.prefill.is_empty() {
            write!(f, " prefill[")?;
            for (i, c) in self.prefill.iter().enumerate() {
                let sample = if c.samples { "*" } else { "" };
                write!(
                    f,
                    "{}{}@{}+{}{sample}",
                    if i > 0 { " " } else { "" },
                    c.id.0,
                    c.start,
                    c.len
                )?;
            }
            write!(f, "]")?;
        }
        if !self.admitted.is_empty() {
            write!(f, " admitted[")?;
            for (i, a) in self.admitted.iter().enumerate() {
                write!(f, "{}{}", if i > 0 { " " } else { "" }, a.id.0)?;
                if a.cached_tokens > 0 {
                    write!(f, "(cached {})", a.cached_tokens)?;
                }
            }
            write!(f, "]")?;
        }
        ids(f, "preempted", &self.preempted)?;
        ids(f, "deferred", &self.deferred)?;
        match self.admission_stop {
            None | Some(AdmissionStop::QueueEmpty) => Ok(()),
            Some(AdmissionStop::BudgetExhausted) => write!(f, " | budget exhausted"),
            Some(AdmissionStop::MaxRunning) => write!(f, " | max running"),
            Some(AdmissionStop::Cadence) => write!(f, " | joins later"),
            Some(AdmissionStop::KvFull {
                id,
                needed,
                available,
            }) => {
                write!(
                    f,
                    " | kv full for {} (need {needed}, have {available})",
                    id.0
                )
            }
        }
    }
}
