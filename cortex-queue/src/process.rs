//! Which worker processes are alive on this host (Linux `/proc`; elsewhere
//! nothing is known and leases simply expire).

/// This host and boot: a process id means something only within one boot of
/// one host. `CORTEX_HOST_ID` overrides it (containers that share a kernel's
/// boot id, or tests that play several hosts on one machine).
pub fn host_identity() -> String {
    if let Some(id) = std::env::var("CORTEX_HOST_ID")
        .ok()
        .filter(|v| !v.is_empty())
    {
        return id;
    }
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|s| s.trim().to_owned())
            .ok()
    };
    let host = read("/proc/sys/kernel/hostname")
        .or_else(|| read("/etc/hostname"))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown-host".into());
    match read("/proc/sys/kernel/random/boot_id") {
        Some(boot) => format!("{host}/{boot}"),
        None => host,
    }
}

/// The start time of a process (clock ticks since boot), or `None` if it is
/// gone, a zombie, or unknowable.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is the state (field 3 of proc(5)); starttime is field 22.
    if matches!(fields.first(), Some(&("Z" | "X" | "x"))) {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// This process's pid and start time.
pub fn this_process() -> (u32, u64) {
    let pid = std::process::id();
    (pid, start_time(pid).unwrap_or(0))
}

/// Whether the process `(pid, started)` is certainly gone. `false` when it
/// lives or when this host cannot tell (no `/proc`).
pub fn is_gone(pid: u32, started: u64) -> bool {
    if !std::path::Path::new("/proc/self/stat").exists() {
        return false;
    }
    match start_time(pid) {
        None => true,
        // The pid was reused by a newer process.
        Some(now) => started != 0 && now != started,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_reaped_child_is_gone() {
        let (pid, started) = this_process();
        assert!(!is_gone(pid, started));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let (child_pid, child_started) = (child.id(), start_time(child.id()).unwrap_or(0));
        child.wait().unwrap();
        assert!(is_gone(child_pid, child_started));
        assert!(!host_identity().is_empty());
    }
}
