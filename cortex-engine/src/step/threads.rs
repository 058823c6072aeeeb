//! Threads on a shared machine. llama.cpp's threads meet at a spinning
//! barrier after every operation of the graph; when another process takes
//! one of our cores, the thread left on it is descheduled and the others spin
//! at each barrier until it runs again. Measured on 2 cores (B = 16, the
//! default model): 220 tokens/s alone; with one busy process beside it, 96
//! with 2 threads and 122 with 1; with two, 28 with 2 threads and 100 with 1.
//!
//! So while threads are chosen automatically, the engine watches how much of
//! its CPUs other processes use (from `/proc`: the busy time of the CPUs it
//! may run on, minus its own) and decodes with the cores left to it, at
//! least one: fewer at once when others arrive, more again once they have
//! been gone for two windows.

use std::time::{Duration, Instant};

/// How often the load of other processes is sampled.
const WINDOW: Duration = Duration::from_secs(2);

/// CPU time, in clock ticks, of the CPUs this process may run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuSample {
    /// Busy time of those CPUs (all processes).
    busy: u64,
    /// Busy plus idle time of those CPUs.
    total: u64,
    /// This process's own CPU time.
    own: u64,
    /// How many CPUs.
    cpus: usize,
}

/// Picks the thread count for the next decodes.
#[derive(Debug)]
pub(super) struct ThreadGovernor {
    max: usize,
    current: usize,
    last: Option<(Instant, CpuSample)>,
    /// Consecutive windows that asked for more threads.
    calm: u32,
}

impl ThreadGovernor {
    /// Adapts between 1 and `max` threads, starting at `max`.
    pub(super) fn new(max: usize) -> Self {
        Self {
            max: max.max(1),
            current: max.max(1),
            last: None,
            calm: 0,
        }
    }

    /// Called before each step; returns a new thread count when it should change.
    pub(super) fn tick(&mut self, now: Instant) -> Option<usize> {
        if self
            .last
            .is_some_and(|(at, _)| now.duration_since(at) < WINDOW)
        {
            return None;
        }
        let sample = read_sample()?;
        let (_, before) = self.last.replace((now, sample))?;
        let others = others_cores(&before, &sample)?;
        self.decide(others)
    }

    /// Forgets the last sample (the engine went idle: idle time says nothing).
    pub(super) fn pause(&mut self) {
        self.last = None;
    }

    /// The decision for a window in which other processes used `others`
    /// cores on average: fewer threads at once, more after two calm windows.
    fn decide(&mut self, others: f64) -> Option<usize> {
        let wanted = (self.max as f64 - others.round()).clamp(1.0, self.max as f64) as usize;
        if wanted < self.current {
            self.calm = 0;
            self.current = wanted;
            return Some(wanted);
        }
        if wanted > self.current {
            self.calm += 1;
            if self.calm >= 2 {
                self.calm = 0;
                self.current = wanted;
                return Some(wanted);
            }
        } else {
            self.calm = 0;
        }
        None
    }
}

/// Cores other processes used between two samples.
fn others_cores(before: &CpuSample, after: &CpuSample) -> Option<f64> {
    let total = after.total.checked_sub(before.total)?;
    if total == 0 || after.cpus == 0 {
        return None;
    }
    let busy = after.busy.saturating_sub(before.busy);
    let own = after.own.saturating_sub(before.own);
    let per_cpu = total as f64 / after.cpus as f64;
    Some(busy.saturating_sub(own) as f64 / per_cpu)
}

fn read_sample() -> Option<CpuSample> {
    let allowed = allowed_cpus(&std::fs::read_to_string("/proc/self/status").ok()?)?;
    let (busy, total, cpus) = cpu_times(&std::fs::read_to_string("/proc/stat").ok()?, &allowed)?;
    let own = own_ticks(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(CpuSample {
        busy,
        total,
        own,
        cpus,
    })
}

/// The CPUs this process may run on, from `Cpus_allowed_list: 0-3,8`.
fn allowed_cpus(status: &str) -> Option<Vec<usize>> {
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse().ok()?),
            None => cpus.push(part.trim().parse().ok()?),
        }
    }
    Some(cpus)
}

/// Busy and total ticks summed over `cpus`, from `/proc/stat`'s `cpuN` lines.
fn cpu_times(stat: &str, cpus: &[usize]) -> Option<(u64, u64, usize)> {
    let (mut busy, mut total, mut found) = (0, 0, 0);
    for line in stat.lines() {
        let mut fields = line.split_whitespace();
        let Some(cpu) = fields
            .next()
            .and_then(|name| name.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        if !cpus.contains(&cpu) {
            continue;
        }
        let ticks: Vec<u64> = fields.take(8).filter_map(|f| f.parse().ok()).collect();
        let [user, nice, system, idle, iowait, irq, softirq, steal] = ticks[..] else {
            return None;
        };
        busy += user + nice + system + irq + softirq + steal;
        total += user + nice + system + idle + iowait + irq + softirq + steal;
        found += 1;
    }
    (found > 0).then_some((busy, total, found))
}

/// This process's user plus system ticks, from `/proc/self/stat`.
fn own_ticks(stat: &str) -> Option<u64> {
    // Fields after the command name (which may hold spaces) start at state.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after ')'.
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_threads_at_once_and_more_after_two_calm_windows() {
        let mut g = ThreadGovernor::new(2);
        assert_eq!(g.decide(0.1), None);
        assert_eq!(g.decide(0.7), Some(1), "another process took a core");
        assert_eq!(g.decide(1.0), None);
        assert_eq!(g.decide(0.1), None, "one calm window is not enough");
        assert_eq!(g.decide(1.2), None);
        assert_eq!(g.decide(0.0), None);
        assert_eq!(g.decide(0.2), Some(2));
        assert_eq!(g.decide(5.0), Some(1), "never below one thread");
        let mut wide = ThreadGovernor::new(8);
        assert_eq!(wide.decide(2.6), Some(5));
    }

    #[test]
    fn proc_files_parse() {
        assert_eq!(
            allowed_cpus("Name:\tx\nCpus_allowed_list:\t0-2,5\n"),
            Some(vec![0, 1, 2, 5])
        );
        let stat = "cpu  10 0 10 80 0 0 0 0 0 0\ncpu0 4 0 6 40 0 0 0 0 0 0\ncpu1 6 0 4 40 0 0 0 0 0 0\nintr 1\n";
        assert_eq!(cpu_times(stat, &[0, 1]), Some((20, 100, 2)));
        assert_eq!(cpu_times(stat, &[1]), Some((10, 50, 1)));
        let own = "42 (cortex worker) R 1 42 42 0 -1 4194304 100 0 0 0 7 3 0 0 20 0 3 0";
        assert_eq!(own_ticks(own), Some(10));
        let before = CpuSample {
            busy: 100,
            total: 400,
            own: 50,
            cpus: 2,
        };
        let after = CpuSample {
            busy: 400,
            total: 800,
            own: 250,
            cpus: 2,
        };
        // 400 ticks over 2 CPUs: 200 per CPU; others used 100 of the 300 busy.
        assert_eq!(others_cores(&before, &after), Some(0.5));
        assert!(read_sample().is_some(), "this machine has /proc");
    }
}
