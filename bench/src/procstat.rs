//! CPU time and memory of processes, from `/proc`: user+system CPU ticks from
//! `/proc/<pid>/stat`, resident and peak resident memory (`VmRSS`, `VmHWM`) from
//! `/proc/<pid>/status`, resetting the peak through `/proc/<pid>/clear_refs`, and a scan
//! of every process (for the CPU used by processes that are not part of the benchmark).
//! Linux only; this module never changes a process beyond resetting its peak RSS.

use std::collections::HashMap;

/// Clock ticks per second of the `/proc/<pid>/stat` times.
pub fn ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second().max(1)
}

/// One line of `/proc/<pid>/stat`, the fields this crate uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    pub ppid: u32,
    /// utime + stime, in clock ticks (all threads of the process).
    pub cpu_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may contain spaces and
/// parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); ppid is field 4, utime 14, stime 15.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(Stat { ppid, cpu_ticks: utime + stime })
}

pub fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A `kB` field of `/proc/<pid>/status` ("VmRSS", "VmHWM"), in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// Resets the peak resident set size (`VmHWM`) of `pid` to its current RSS.
pub fn reset_peak(pid: u32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// Every process on the machine: pid → stat.
pub fn all() -> HashMap<u32, Stat> {
    let mut out = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if let Some(s) = stat(pid) {
            out.insert(pid, s);
        }
    }
    out
}

/// The direct children of `pid` in a scan.
pub fn children(scan: &HashMap<u32, Stat>, pid: u32) -> Vec<u32> {
    let mut c: Vec<u32> = scan.iter().filter(|(_, s)| s.ppid == pid).map(|(p, _)| *p).collect();
    c.sort_unstable();
    c
}

/// Whether `pid` is `root` or one of its descendants in a scan.
pub fn descends_from(scan: &HashMap<u32, Stat>, mut pid: u32, root: u32) -> bool {
    for _ in 0..64 {
        if pid == root {
            return true;
        }
        match scan.get(&pid) {
            Some(s) if s.ppid != 0 && s.ppid != pid => pid = s.ppid,
            _ => return false,
        }
    }
    false
}

/// CPU seconds used between two scans by processes that do not descend from `root`
/// (other users of the machine). Processes that started between the scans count whole;
/// processes that ended between them are missed.
pub fn foreign_cpu_seconds(before: &HashMap<u32, Stat>, after: &HashMap<u32, Stat>, root: u32) -> f64 {
    let ticks: u64 = after
        .iter()
        .filter(|(pid, _)| !descends_from(after, **pid, root))
        .map(|(pid, s)| s.cpu_ticks.saturating_sub(before.get(pid).map_or(0, |b| b.cpu_ticks)))
        .sum();
    ticks as f64 / ticks_per_second() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_command_names() {
        let line = "1234 (my (odd) name) S 99 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 1000 0 0";
        assert_eq!(parse_stat(line), Some(Stat { ppid: 99, cpu_ticks: 300 }));
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(stat(me).is_some());
        assert!(status_kib(me, "VmRSS").unwrap() > 0);
        assert!(status_kib(me, "VmHWM").unwrap() > 0);
        let scan = all();
        assert!(descends_from(&scan, me, me));
        assert!(!descends_from(&scan, 1, me));
    }
}
