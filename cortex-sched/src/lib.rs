//! Continuous batching as a pure state machine.
//!
//! A [`Scheduler`] holds waiting and running requests and owns the
//! [`cortex_kv::KvCache`] accounting for their KV. Each [`Scheduler::schedule`]
//! call returns a [`StepPlan`]: the decode tokens and prefill chunks to compute
//! in one step, within a token budget and a cap on running sequences, plus what
//! was admitted, preempted or deferred and why admission stopped. The engine
//! runs the plan and reports the sampled tokens with [`Scheduler::commit`].
//! Data in, decisions out: no threads, no I/O, no clock (time is counted in steps).
//!
//! The policy is described on [`Scheduler`]: decode first, then chunked
//! prefill; admission by free KV blocks, by priority with aging and FIFO within
//! a priority, cached prefixes first; preemption by recompute when the pool runs
//! out.
//!
//! # Example
//!
//! ```
//! use cortex_request::{CacheScope, RequestId};
//! use cortex_sched::{SchedConfig, SchedRequest, Scheduler};
//!
//! let config = SchedConfig {
//!     max_batch_tokens: 8,
//!     max_running: 4,
//!     kv_blocks: 16,
//!     kv_block_size: 4,
//!     ..SchedConfig::default()
//! };
//! let mut sched = Scheduler::new(config)?;
//! sched.add(SchedRequest { id: RequestId(1), prompt: (0..10).collect(), max_new_tokens: 2, priority: 0, cache_scope: CacheScope::SHARED })?;
//!
//! // The 10-token prompt is chunked to the 8-token budget.
//! let plan = sched.schedule();
//! assert_eq!(plan.to_string(), "step 1: prefill[1@0+8] admitted[1] | budget exhausted");
//! sched.commit(&plan, &[]);
//!
//! let plan = sched.schedule();
//! assert_eq!(plan.to_string(), "step 2: prefill[1@8+2*]");
//! sched.commit(&plan, &[(RequestId(1), 42)]); // the first generated token
//!
//! let plan = sched.schedule();
//! assert_eq!(plan.decode, [RequestId(1)]);
//! let finished = sched.commit(&plan, &[(RequestId(1), 43)]);
//! assert_eq!(finished, [RequestId(1)]); // max_new_tokens reached
//! assert!(!sched.has_work());
//! # Ok::<(), cortex_sched::SchedError>(())
//! ```
//!
//! # Design notes
//!
//! `Scheduler` is continuous batching as a state machine: `add` requests,
//! `schedule()` returns a `StepPlan`, the engine runs it and calls `commit` with
//! the sampled tokens. A step decodes first (one token per running request, most
//! important first, preempting the lowest-priority newest request by recompute
//! when KV runs out), then continues chunked prefills, then admits waiting
//! requests: preempted ones first, then by priority with aging (a static queue
//! key `step - priority * aging_steps`, FIFO within a priority, no starvation),
//! preferring cached prefixes within the head's priority and deferring requests
//! whose prefix is being computed. Admission stops at the first request the KV
//! pool cannot hold. With `priority_preemption_gap`, a waiting request that
//! outranks the lowest running one (that ran before this step) by the gap takes
//! its slot when none is free; the victim waits again by its own priority and
//! its planned tokens go back to the budget. The engine does not turn this on
//! yet: its stream binding can run out of streams when preemption and
//! admissions of shared prefixes meet in one step (seen under load). With
//! `admit_every` above 1, waiting requests join only on every such step
//! while others run, so the steps between decode the same sequences (a GPU
//! replays a batch whose shape repeats). Each plan says why admission
//! stopped. Time is counted in steps; there are no clocks, threads or I/O.

#![forbid(unsafe_code)]

mod plan;
mod scheduler;

pub use plan::{Admission, AdmissionStop, PrefillChunk, StepPlan};
pub use scheduler::{SchedConfig, SchedError, SchedRequest, SchedStats, Scheduler};
