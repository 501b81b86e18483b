//! What the kernel knows about a contender process: CPU time from
//! `/proc/<pid>/stat` (utime + stime) and memory from `/proc/<pid>/status`
//! (`VmRSS` now, `VmHWM` = peak resident set since the process started).

use std::io;

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcSample {
    /// User + system CPU seconds since the process started.
    pub cpu_secs: f64,
    pub rss_kib: u64,
    pub hwm_kib: u64,
}

/// Clock ticks per second of `/proc/<pid>/stat`'s utime and stime.
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

pub fn sample(pid: u32, ticks: f64) -> io::Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("/proc/{pid}: unexpected format"),
        )
    };
    Ok(ProcSample {
        cpu_secs: cpu_ticks(&stat).ok_or_else(bad)? as f64 / ticks,
        rss_kib: status_kib(&status, "VmRSS").ok_or_else(bad)?,
        hwm_kib: status_kib(&status, "VmHWM").ok_or_else(bad)?,
    })
}

/// Resets the process's peak resident set (`VmHWM`) to its current RSS (`5` written to
/// `/proc/<pid>/clear_refs`; Linux 4.0+, our own processes), so that a later reading is the
/// peak of what came after.
pub fn reset_peak(pid: u32) -> io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// utime + stime (fields 14 and 15) of a `/proc/<pid>/stat` line. The command
/// name (field 2) may hold spaces and parentheses, so fields are counted from
/// the last `)`.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// A `Key:   1234 kB` line of `/proc/<pid>/status`, in KiB.
pub fn status_kib(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        if k != key {
            return None;
        }
        v.split_whitespace().next()?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_is_utime_plus_stime_even_with_odd_command_names() {
        let stat = "4242 (csi (prov) x) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 12 0 100 0 0";
        assert_eq!(cpu_ticks(stat), Some(325));
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn reads_memory_lines_in_kib() {
        let status = "Name:\tcsi\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(status_kib(status, "VmRSS"), Some(10240));
        assert_eq!(status_kib(status, "VmHWM"), Some(20480));
        assert_eq!(status_kib(status, "VmSwap"), None);
    }

    #[test]
    fn the_peak_can_be_reset_to_the_current_rss() {
        let me = std::process::id();
        // 64 MiB touched, then given back (an allocation this large is its own mapping).
        let grown = std::hint::black_box(vec![1u8; 64 << 20]);
        let before = sample(me, clock_ticks()).unwrap();
        drop(grown);
        reset_peak(me).unwrap();
        let after = sample(me, clock_ticks()).unwrap();
        assert!(
            after.hwm_kib + (32 << 10) < before.hwm_kib,
            "the peak forgot the 64 MiB: {before:?} {after:?}"
        );
        assert!(after.hwm_kib >= after.rss_kib, "{after:?}");
    }

    #[test]
    fn samples_this_process() {
        let s = sample(std::process::id(), clock_ticks()).unwrap();
        assert!(s.rss_kib > 0 && s.hwm_kib >= s.rss_kib, "{s:?}");
    }
}
