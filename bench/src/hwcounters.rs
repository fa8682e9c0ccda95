//! Hardware counters of processes with `perf stat`: instructions and cycles a process ran
//! over a measurement, where the CPU (or the VM) exposes them. Many VMs do not; there
//! `perf stat` prints `<not supported>` for both events, and the report says so and
//! points to `agent-reach-bench instructions` (instructions under callgrind), which works
//! everywhere.
//!
//! [`detect`] runs `perf stat -x, -e instructions,cycles -- true` once; [`Session`]
//! attaches `perf stat -x, -e instructions,cycles -p PIDS -o FILE` to running processes
//! and, when stopped with SIGINT, reads the counts from the file. Output is perf's CSV
//! (`-x,`): one line per event, `value,unit,event,run time,percentage,metric,metric unit`,
//! the value `<not supported>` or `<not counted>` where there is no count.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};
use serde::{Deserialize, Serialize};

/// The events counted, in `-e` syntax.
pub const EVENTS: &str = "instructions,cycles";

/// Instructions and cycles over one measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    pub instructions: u64,
    pub cycles: u64,
}

/// Whether `perf stat` counts instructions and cycles on this machine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Availability {
    Available,
    /// Why not, in perf's words (e.g. `<not supported>`, or perf missing).
    Unavailable(String),
}

impl Availability {
    pub fn available(&self) -> bool {
        *self == Availability::Available
    }

    /// The report's line about hardware counters.
    pub fn describe(&self) -> String {
        match self {
            Availability::Available => format!(
                "perf stat -x, -e {EVENTS} -p PID of every proxy process over each fixed-rate run (warm-up included, \
                 as for CPU); per call = count / calls answered"
            ),
            Availability::Unavailable(reason) => format!(
                "not available on this machine (perf stat: {reason}); instructions per call under callgrind: \
                 `agent-reach-bench instructions`"
            ),
        }
    }
}

/// Runs `perf stat` once on `true` and reads whether both events were counted.
pub fn detect() -> Availability {
    match Command::new("perf").args(["stat", "-x,", "-e", EVENTS, "--", "true"]).stdin(Stdio::null()).output() {
        Err(e) => Availability::Unavailable(format!("cannot run perf: {e}")),
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stderr);
            match parse(&text) {
                Ok(_) if out.status.success() => Availability::Available,
                Ok(_) => Availability::Unavailable(format!("exited with {}", out.status)),
                Err(reason) => Availability::Unavailable(reason),
            }
        }
    }
}

/// Instructions and cycles from `perf stat -x,` output; else why there are none: perf's
/// placeholder (`<not supported>`, `<not counted>`) or its first line of error text.
pub fn parse(text: &str) -> Result<Counts, String> {
    let (mut instructions, mut cycles) = (None, None);
    for line in text.lines().filter(|l| !l.trim().is_empty() && !l.starts_with('#')) {
        let fields: Vec<&str> = line.split(',').collect();
        let Some(event) = fields.get(2) else { continue };
        // perf names user-space-only counts "instructions:u" (non-root, paranoid >= 2).
        let slot = match event.split(':').next().unwrap_or("") {
            "instructions" => &mut instructions,
            "cycles" => &mut cycles,
            _ => continue,
        };
        let value = fields[0].trim();
        *slot = Some(value.parse::<u64>().map_err(|_| value.to_string()));
    }
    match (instructions, cycles) {
        (Some(i), Some(c)) => Ok(Counts { instructions: i?, cycles: c? }),
        _ => {
            // perf's error text: its first line, and the next when the first only says "Error:".
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#'));
            Err(match (lines.next(), lines.next()) {
                (Some(first), Some(next)) if first.ends_with(':') => format!("{first} {next}"),
                (Some(first), _) => first.to_string(),
                (None, _) => "no output".into(),
            })
        }
    }
}

/// `perf stat` attached to running processes until [`finish`](Session::finish).
pub struct Session {
    child: Child,
    out: PathBuf,
}

impl Session {
    /// Attaches to `pids` (counted together), perf itself on `cpus` when given. Returns
    /// once perf has had time to attach.
    pub fn start(pids: &[u32], cpus: Option<&str>, out: &Path) -> Result<Session, String> {
        let list = pids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut cmd = crate::procs::command(Path::new("perf"), cpus);
        cmd.args(["stat", "-x,", "-e", EVENTS, "-p", &list, "-o"])
            .arg(out)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd.spawn().map_err(|e| format!("perf stat -p {list}: {e}"))?;
        std::thread::sleep(Duration::from_millis(150));
        Ok(Session { child, out: out.to_path_buf() })
    }

    /// Stops perf (SIGINT, as ctrl-c: it writes the counts) and reads them.
    pub fn finish(mut self) -> Result<Counts, String> {
        if let Some(pid) = Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, Signal::INT);
        }
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let text = std::fs::read_to_string(&self.out).map_err(|e| format!("{}: {e}", self.out.display()))?;
        parse(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `perf stat -x, -e instructions,cycles -o FILE -- sleep 0.1` on this project's 2-core
    /// AMD EPYC VM (perf 6.1.187, Linux 6.1), which exposes no hardware counters.
    const NOT_SUPPORTED: &str = "# started on Wed Dec  2 12:56:40 2026\n\n\
        <not supported>,,instructions,0,100.00,,\n<not supported>,,cycles,0,100.00,,\n";

    /// The same command's output where the counters exist, in perf 6.1's CSV layout (the
    /// layout this VM prints for software events: `1291.31,msec,task-clock,1307299,100.00,
    /// 0.025,CPUs utilized`), with perf's metric columns.
    const COUNTED: &str = "# started on Wed Dec  2 12:56:44 2026\n\n\
        1843112,,instructions,1307299,100.00,0.71,insn per cycle\n\
        2596030,,cycles,1307299,100.00,1.986,GHz\n";

    #[test]
    fn reads_counts_and_the_reason_when_there_are_none() {
        assert_eq!(parse(COUNTED), Ok(Counts { instructions: 1_843_112, cycles: 2_596_030 }));
        assert_eq!(parse(NOT_SUPPORTED), Err("<not supported>".into()));
        // Non-root: user-space-only events.
        let user = "1000,,instructions:u,50,100.00,0.50,insn per cycle\n2000,,cycles:u,50,100.00,,\n";
        assert_eq!(parse(user), Ok(Counts { instructions: 1000, cycles: 2000 }));
        // A process that never ran while attached.
        assert_eq!(parse("<not counted>,,instructions,0,0.00,,\n7,,cycles,1,100.00,,\n"), Err("<not counted>".into()));
        let refused = "Error:\nAccess to performance monitoring and observability operations is limited.\n";
        assert_eq!(
            parse(refused),
            Err("Error: Access to performance monitoring and observability operations is limited.".into())
        );
        assert_eq!(parse(""), Err("no output".into()));
    }

    #[test]
    fn the_report_line_names_the_reason_and_the_fallback() {
        let line = Availability::Unavailable("<not supported>".into()).describe();
        assert_eq!(
            line,
            "not available on this machine (perf stat: <not supported>); instructions per call under callgrind: \
             `agent-reach-bench instructions`"
        );
        assert!(Availability::Available.describe().starts_with("perf stat -x, -e instructions,cycles -p PID"));
    }

    /// Attaching to a busy process and stopping perf gives counts exactly where the
    /// detection says counters exist, and the same reason where it says they do not.
    #[test]
    fn a_session_agrees_with_the_detection() {
        let hw = detect();
        let mut busy = Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let session = match Session::start(&[busy.id()], None, &dir.path().join("perf.csv")) {
            Ok(s) => s,
            Err(e) => {
                let _ = busy.kill();
                let _ = busy.wait();
                assert!(!hw.available(), "perf counts here but does not start: {e}");
                return;
            }
        };
        std::thread::sleep(Duration::from_millis(200));
        let counted = session.finish();
        let _ = busy.kill();
        let _ = busy.wait();
        match hw {
            Availability::Available => {
                let c = counted.unwrap();
                assert!(c.instructions > 0 && c.cycles > 0, "{c:?}");
            }
            Availability::Unavailable(reason) => assert_eq!(counted.map_err(|e| e == reason), Err(true)),
        }
    }
}
