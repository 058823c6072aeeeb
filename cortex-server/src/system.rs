//! The process's and the machine's CPU and memory, read from Linux's
//! `/proc` at each scrape (elsewhere nothing is known and the figures are
//! absent). CPU use is a ratio over the time since the previous scrape.

use std::sync::Mutex;
use std::time::Instant;

/// CPU and memory now; `None` where this system does not tell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct SystemGauges {
    /// CPU time this process used since it started (s).
    pub(crate) process_cpu_seconds: Option<f64>,
    /// Of one core, the share this process used since the last scrape
    /// (2.0: two cores busy).
    pub(crate) process_cpu_cores: Option<f64>,
    /// This process's resident memory (bytes).
    pub(crate) process_resident_bytes: Option<u64>,
    /// Of all cores, the share in use since the last scrape (0..=1).
    pub(crate) machine_cpu_ratio: Option<f64>,
    /// Cores online.
    pub(crate) machine_cpus: Option<u64>,
    /// All memory (bytes).
    pub(crate) memory_total_bytes: Option<u64>,
    /// Memory available to new work without swapping (bytes).
    pub(crate) memory_available_bytes: Option<u64>,
}

/// The last reading, to turn CPU totals into use over a span.
struct Reading {
    at: Instant,
    process_cpu_seconds: f64,
    machine: (u64, u64),
}

/// Linux's USER_HZ (clock ticks in `/proc`) and page size on every
/// architecture cortex builds for.
const TICKS_PER_SECOND: f64 = 100.0;
const PAGE_BYTES: u64 = 4096;

/// Reads the gauges; remembers each reading for the next one's ratios.
pub(crate) struct SystemSampler {
    last: Mutex<Option<Reading>>,
}

impl SystemSampler {
    pub(crate) fn new() -> Self {
        Self {
            last: Mutex::new(None),
        }
    }

    pub(crate) fn sample(&self) -> SystemGauges {
        let process_cpu_seconds = process_cpu_ticks().map(|t| t as f64 / TICKS_PER_SECOND);
        let machine = machine_cpu_ticks();
        let now = Instant::now();
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut gauges = SystemGauges {
            process_cpu_seconds,
            process_resident_bytes: resident_pages().map(|p| p * PAGE_BYTES),
            machine_cpus: std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as u64),
            ..SystemGauges::default()
        };
        if let Ok(memory) = std::fs::read_to_string("/proc/meminfo") {
            gauges.memory_total_bytes = meminfo_kib(&memory, "MemTotal:").map(|k| k * 1024);
            gauges.memory_available_bytes = meminfo_kib(&memory, "MemAvailable:").map(|k| k * 1024);
        }
        if let (Some(previous), Some(cpu), Some(machine)) =
            (last.as_ref(), process_cpu_seconds, machine)
        {
            let span = now.duration_since(previous.at).as_secs_f64();
            if span > 0.0 {
                gauges.process_cpu_cores =
                    Some(((cpu - previous.process_cpu_seconds) / span).max(0.0));
            }
            let (busy, total) = (
                machine.0.saturating_sub(previous.machine.0),
                machine.1.saturating_sub(previous.machine.1),
            );
            if total > 0 {
                gauges.machine_cpu_ratio = Some(busy as f64 / total as f64);
            }
        }
        if let (Some(cpu), Some(machine)) = (process_cpu_seconds, machine) {
            *last = Some(Reading {
                at: now,
                process_cpu_seconds: cpu,
                machine,
            });
        }
        gauges
    }
}

/// This process's user plus system time (clock ticks).
fn process_cpu_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields resume after the command name's closing parenthesis: the
    // state is field 3, utime and stime fields 14 and 15.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some(ticks(11)? + ticks(12)?)
}

/// The machine's busy and total CPU time (clock ticks) from `/proc/stat`.
fn machine_cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_cpu_line(stat.lines().next()?)
}

/// `cpu user nice system idle iowait irq softirq steal ...`: idle and
/// iowait are not busy.
fn parse_cpu_line(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    (fields.next()? == "cpu").then_some(())?;
    let values: Vec<u64> = fields
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    let total: u64 = values.iter().sum();
    let idle = values.get(3)? + values.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

fn resident_pages() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    statm.split_whitespace().nth(1)?.parse().ok()
}

fn meminfo_kib(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    line[key.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lines_and_meminfo_parse() {
        assert_eq!(
            parse_cpu_line("cpu  10 0 5 80 5 0 0 0 0 0"),
            Some((15, 100))
        );
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4"), None);
        let meminfo = "MemTotal:       24000000 kB\nMemFree: 1 kB\nMemAvailable:   12000 kB\n";
        assert_eq!(meminfo_kib(meminfo, "MemTotal:"), Some(24_000_000));
        assert_eq!(meminfo_kib(meminfo, "MemAvailable:"), Some(12_000));
    }

    #[test]
    fn a_second_sample_measures_cpu_use_on_linux() {
        let sampler = SystemSampler::new();
        let first = sampler.sample();
        if first.process_cpu_seconds.is_none() {
            return; // No /proc here.
        }
        assert!(first.process_resident_bytes.unwrap() > 0);
        assert!(first.memory_total_bytes.unwrap() >= first.memory_available_bytes.unwrap());
        let spin = Instant::now();
        while spin.elapsed().as_millis() < 50 {
            std::hint::black_box(spin.elapsed());
        }
        let second = sampler.sample();
        let cores = second.process_cpu_cores.expect("a ratio after two samples");
        assert!((0.0..=64.0).contains(&cores), "{cores}");
        assert!((0.0..=1.0).contains(&second.machine_cpu_ratio.unwrap()));
    }
}
