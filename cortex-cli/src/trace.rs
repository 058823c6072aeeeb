//! `cortex run --trace FILE`: where a job's time goes. The engine reports
//! every step ([`StepRecord`]); this writes each as a JSON line and sums
//! them into a summary: the share of time in `llama_decode`, tokens per
//! step, prompt tokens computed against the least a job needs (each
//! distinct prefix once, counted over a tree of every prompt's tokens), the
//! attention cells llama.cpp spans beyond those it must read (padding), and
//! the micro-batches llama.cpp splits steps into (passes over the weights).

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use cortex_engine::{StepObserver, StepRecord};
use cortex_request::TokenId;

/// Totals over a trace.
#[derive(Debug, Default)]
pub(crate) struct TraceSummary {
    steps: u64,
    /// Step loops seen (their times overlap).
    loops: usize,
    span: f64,
    decode_seconds: f64,
    wait_seconds: f64,
    sample_seconds: f64,
    host_seconds: f64,
    gap_seconds: f64,
    kv_rebuild_seconds: f64,
    kv_rebuilds: u64,
    generated_tokens: u64,
    device_sampled_tokens: u64,
    decode_sequences: u64,
    prefill_tokens: u64,
    decode_steps: u64,
    kv_cells_used: u64,
    kv_cells_attended: u64,
    micro_batches: u64,
    graphs_reused: u64,
    gap_fillers: u64,
    chunks_evened: u64,
    /// Steps whose batch llama.cpp refused (decoded again stream by stream).
    refused_batches: u64,
    prompt_tokens: u64,
    /// Every prompt's tokens as a tree: (parent node, token) → node.
    prefixes: HashMap<(u32, TokenId), u32>,
}

impl TraceSummary {
    fn add_prompt(&mut self, tokens: &[TokenId]) {
        self.prompt_tokens += tokens.len() as u64;
        let mut node = 0u32;
        for &token in tokens {
            let next = u32::try_from(self.prefixes.len() + 1).unwrap_or(u32::MAX);
            node = *self.prefixes.entry((node, token)).or_insert(next);
        }
    }

    fn add_step(&mut self, r: &StepRecord) {
        self.steps += 1;
        self.loops = self.loops.max(r.step_loop + 1);
        let end = r.at
            + r.host_seconds
            + r.decode_seconds
            + r.wait_seconds
            + r.sample_seconds
            + r.kv_rebuild_seconds;
        self.span = self.span.max(end);
        self.decode_seconds += r.decode_seconds;
        self.wait_seconds += r.wait_seconds;
        self.sample_seconds += r.sample_seconds;
        self.host_seconds += r.host_seconds;
        self.gap_seconds += r.gap_seconds;
        self.kv_rebuild_seconds += r.kv_rebuild_seconds;
        self.kv_rebuilds += u64::from(r.kv_rebuild_seconds > 0.0);
        self.generated_tokens += r.generated_tokens as u64;
        self.device_sampled_tokens += r.device_sampled_tokens as u64;
        self.decode_sequences += r.decode_sequences as u64;
        self.prefill_tokens += r.prefill_tokens as u64;
        self.decode_steps += u64::from(r.decode_sequences > 0);
        self.kv_cells_used += r.kv_cells_used as u64;
        self.kv_cells_attended += r.kv_cells_attended as u64;
        self.micro_batches += r.micro_batches as u64;
        self.graphs_reused += r.graphs_reused as u64;
        self.gap_fillers += r.gap_fillers as u64;
        self.chunks_evened += r.chunks_evened as u64;
        self.refused_batches += u64::from(r.decode_calls > 1);
    }

    /// The summary, for people.
    pub(crate) fn text(&self) -> String {
        let share = |part: f64| {
            if self.span > 0.0 {
                100.0 * part / self.span
            } else {
                0.0
            }
        };
        let per_step = |n: u64| n as f64 / self.steps.max(1) as f64;
        let padding = if self.kv_cells_attended > 0 {
            100.0 * (1.0 - self.kv_cells_used as f64 / self.kv_cells_attended as f64)
        } else {
            0.0
        };
        let loops = if self.loops > 1 {
            format!(
                " ({} step loops at once: each share is of their added times)",
                self.loops
            )
        } else {
            String::new()
        };
        let share = |part: f64| {
            let all = self.decode_seconds
                + self.wait_seconds
                + self.sample_seconds
                + self.host_seconds
                + self.gap_seconds
                + self.kv_rebuild_seconds;
            if self.loops > 1 && all > 0.0 {
                100.0 * part / all
            } else {
                share(part)
            }
        };
        let evened = match self.chunks_evened {
            0 => String::new(),
            n => format!("; {n} prompt chunks cut to even out their steps"),
        };
        let rebuilt = match self.kv_rebuilds {
            0 => String::new(),
            n => format!(
                ", rebuilding the KV cache for longer requests {:.1} s ({:.0}%, {})",
                self.kv_rebuild_seconds,
                share(self.kv_rebuild_seconds),
                if n == 1 {
                    "once".to_owned()
                } else {
                    format!("{n} times")
                }
            ),
        };
        let refused = match self.refused_batches {
            0 => String::new(),
            n => format!(
                "\n  {n} steps decoded stream by stream: llama.cpp refused their batch (-vv says why)"
            ),
        };
        format!(
            "trace: {} steps in {:.1} s{loops}: llama_decode {:.1} s ({:.0}%), waiting for the device {:.1} s ({:.0}%), \
             sampling {:.1} s ({:.0}%), other host work in steps {:.1} s ({:.0}%), between steps {:.1} s ({:.0}%){rebuilt}\n\
             \u{20} tokens per step {:.1} (decoded {:.1}, prompt {:.1}); {:.1} generated per step, {:.1} sequences per decoding step; {} of {} sampled on the device\n\
             \u{20} prompt tokens computed {} of {} in the prompts; each distinct prefix once would be {}\n\
             \u{20} attention read {} cells and spanned {}: {:.0}% padding\n\
             \u{20} llama.cpp micro-batches (passes over the weights) per step {:.2}, {} of {} on the graph of the one before; {:.1} idle streams filled per step to join runs{evened}{refused}",
            self.steps,
            self.span,
            self.decode_seconds,
            share(self.decode_seconds),
            self.wait_seconds,
            share(self.wait_seconds),
            self.sample_seconds,
            share(self.sample_seconds),
            self.host_seconds,
            share(self.host_seconds),
            self.gap_seconds,
            share(self.gap_seconds),
            per_step(self.decode_sequences + self.prefill_tokens),
            per_step(self.decode_sequences),
            per_step(self.prefill_tokens),
            per_step(self.generated_tokens),
            self.decode_sequences as f64 / self.decode_steps.max(1) as f64,
            self.device_sampled_tokens,
            self.generated_tokens,
            self.prefill_tokens,
            self.prompt_tokens,
            self.prefixes.len(),
            self.kv_cells_used,
            self.kv_cells_attended,
            padding,
            per_step(self.micro_batches),
            self.graphs_reused,
            self.micro_batches,
            per_step(self.gap_fillers),
        )
    }
}

/// Writes each step as a JSON line to a file and keeps the totals.
pub(crate) struct TraceWriter {
    out: BufWriter<File>,
    summary: Arc<Mutex<TraceSummary>>,
}

impl TraceWriter {
    /// A trace into `path`, and the totals it keeps (read them when the
    /// engine is done).
    pub(crate) fn create(path: &Path) -> anyhow::Result<(Self, Arc<Mutex<TraceSummary>>)> {
        let file =
            File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
        let summary = Arc::new(Mutex::new(TraceSummary::default()));
        let writer = Self {
            out: BufWriter::new(file),
            summary: Arc::clone(&summary),
        };
        Ok((writer, summary))
    }

    fn summary(&self) -> std::sync::MutexGuard<'_, TraceSummary> {
        self.summary
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl StepObserver for TraceWriter {
    fn step(&mut self, r: &StepRecord) {
        self.summary().add_step(r);
        // Written straight from the record: a `serde_json::Value` built per
        // step took tens of microseconds of the step loop's time, as much as
        // a one-sequence GPU step's own host work. A trace that cannot be
        // written loses lines, not the job.
        if serde_json::to_writer(&mut self.out, r).is_ok() {
            let _ = self.out.write_all(b"\n");
        }
    }

    fn prompt(&mut self, tokens: &[TokenId]) {
        self.summary().add_prompt(tokens);
    }
}

impl Drop for TraceWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distinct_prefixes_are_counted_once() {
        let mut summary = TraceSummary::default();
        summary.add_prompt(&[1, 2, 3, 4]);
        summary.add_prompt(&[1, 2, 3, 5]);
        summary.add_prompt(&[1, 2, 3, 4]);
        summary.add_prompt(&[9]);
        assert_eq!(summary.prompt_tokens, 13);
        assert_eq!(summary.prefixes.len(), 6);
    }

    #[test]
    fn kv_rebuilds_are_their_own_share_of_the_time() {
        let mut summary = TraceSummary::default();
        let step = |at: f64, decode: f64, rebuild: f64| {
            let mut record = StepRecord::default();
            record.at = at;
            record.decode_seconds = decode;
            record.kv_rebuild_seconds = rebuild;
            record
        };
        summary.add_step(&step(0.0, 1.0, 0.0));
        assert!(!summary.text().contains("rebuilding"), "{}", summary.text());
        summary.add_step(&step(1.0, 0.5, 0.5));
        let text = summary.text();
        assert!(
            text.contains("llama_decode 1.5 s (75%)")
                && text.contains("rebuilding the KV cache for longer requests 0.5 s (25%, once)"),
            "{text}"
        );
        summary.add_step(&step(2.0, 0.0, 2.0));
        assert!(
            summary.text().contains("2.5 s (62%, 2 times)"),
            "{}",
            summary.text()
        );
    }
}
