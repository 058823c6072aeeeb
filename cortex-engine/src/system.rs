//! What the machine and this process have: memory, read from `/proc` (Linux).

/// This process's resident memory, bytes (`/proc/self/status`, Linux).
pub fn resident_memory() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// A line of `/proc/meminfo` (Linux), in bytes: `MemTotal`, `MemAvailable`.
pub fn meminfo(key: &str) -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.split(':').next() == Some(key))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
