//! What the machine offers a model: the memory this process may still use, its resident
//! set, and the settings that slow decoding (transparent huge pages off, a `powersave` CPU
//! frequency governor). Read from `/proc` and `/sys` on Linux (nothing elsewhere).
//!
//! Every file is parsed by a pure function of its contents, so the parsing is tested on
//! fixed inputs; the `read_*` functions only open the files.
//!
//! **Available memory** ([`available_memory`]): the tightest of
//! - cgroup v2 — for the process's own cgroup (the `0::/path` line of `/proc/self/cgroup`)
//!   and each of its ancestors, `memory.max − memory.current` where a limit is set;
//! - cgroup v1 — `memory.limit_in_bytes − memory.usage_in_bytes` of the memory controller's
//!   cgroup, where a limit is set (v1 reports "no limit" as a huge number);
//! - `MemAvailable` from `/proc/meminfo`;
//!
//! less a margin ([`margin_for`]: 5%, at least 32 MiB) for what the estimate cannot see
//! (allocator slack, page tables, other threads' stacks). A cgroup's `memory.current`
//! counts its page cache too, which the kernel can reclaim: the figure errs on the safe side.

use mica_models::MemoryEstimate;
use mica_models::memory::mib;
use std::fmt;
use std::path::{Path, PathBuf};

/// Where an available-memory figure came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// A limit the user gave (no margin taken off).
    Limit,
    /// A cgroup v2 limit: the directory whose `memory.max` binds.
    CgroupV2(PathBuf),
    /// A cgroup v1 memory controller's limit: its directory.
    CgroupV1(PathBuf),
    /// `MemAvailable` in `/proc/meminfo`.
    MemAvailable,
}

impl fmt::Display for MemorySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemorySource::Limit => write!(f, "the given memory limit"),
            MemorySource::CgroupV2(dir) => write!(
                f,
                "cgroup v2 limit: {0}/memory.max − {0}/memory.current",
                dir.display()
            ),
            MemorySource::CgroupV1(dir) => write!(
                f,
                "cgroup v1 limit: {0}/memory.limit_in_bytes − {0}/memory.usage_in_bytes",
                dir.display()
            ),
            MemorySource::MemAvailable => write!(f, "MemAvailable in /proc/meminfo"),
        }
    }
}

/// Memory this process may still use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Available {
    /// What the source reports.
    pub raw: u64,
    /// Kept back from `raw` ([`margin_for`]; 0 for a given limit).
    pub margin: u64,
    pub source: MemorySource,
}

impl Available {
    /// A limit the user gave: all of it usable.
    pub fn limit(bytes: u64) -> Available {
        Available {
            raw: bytes,
            margin: 0,
            source: MemorySource::Limit,
        }
    }

    /// Bytes a model may take: `raw` less the margin.
    pub fn usable(&self) -> u64 {
        self.raw.saturating_sub(self.margin)
    }
}

impl fmt::Display for Available {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} available ({}",
            mib(self.usable() as usize),
            self.source
        )?;
        if self.margin > 0 {
            write!(
                f,
                " = {}, less a margin of {}",
                mib(self.raw as usize),
                mib(self.margin as usize)
            )?;
        }
        write!(f, ")")
    }
}

/// The margin kept back from a measured figure: 5% of it, at least 32 MiB.
pub fn margin_for(bytes: u64) -> u64 {
    (bytes / 20).max(32 << 20)
}

/// A model that does not fit ([`check_fits`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "the model does not fit in memory: it needs {estimate}{}, but only {available}",
    self.already_held()
)]
pub struct DoesNotFit {
    pub estimate: MemoryEstimate,
    pub available: Available,
}

impl DoesNotFit {
    fn already_held(&self) -> String {
        match self.available.source {
            MemorySource::Limit => String::new(),
            _ => format!(
                "; {} more than the process holds now",
                mib(still_needed(&self.estimate, &self.available) as usize)
            ),
        }
    }
}

/// What `estimate` still needs from `available`: all of it against a given limit, but
/// against a measured figure only what the process does not hold yet (the figure already
/// left out its resident set, the estimate's `runtime`).
pub fn still_needed(estimate: &MemoryEstimate, available: &Available) -> u64 {
    let total = estimate.total() as u64;
    match available.source {
        MemorySource::Limit => total,
        _ => total.saturating_sub(estimate.runtime as u64),
    }
}

/// Whether `estimate` fits in `available` ([`still_needed`] against its usable bytes).
pub fn check_fits(estimate: &MemoryEstimate, available: &Available) -> Result<(), DoesNotFit> {
    if still_needed(estimate, available) > available.usable() {
        return Err(DoesNotFit {
            estimate: *estimate,
            available: available.clone(),
        });
    }
    Ok(())
}

/// How far a measured resident set is from the estimate's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RssCheck {
    pub expected: u64,
    pub rss: u64,
}

impl RssCheck {
    /// The tolerance past which the difference deserves a warning.
    pub const TOLERANCE: f64 = 0.10;

    /// `(rss − expected) / expected`, in percent (positive: more resident than estimated).
    pub fn error_pct(&self) -> f64 {
        (self.rss as f64 - self.expected as f64) / (self.expected.max(1) as f64) * 100.0
    }

    /// Whether the error is within [`RssCheck::TOLERANCE`].
    pub fn within_tolerance(&self) -> bool {
        self.error_pct().abs() <= Self::TOLERANCE * 100.0
    }
}

impl fmt::Display for RssCheck {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "resident {} vs estimated {} ({:+.1}%)",
            mib(self.rss as usize),
            mib(self.expected as usize),
            self.error_pct()
        )
    }
}

/// The cgroup v2 path of a `/proc/self/cgroup` file (its `0::/path` line).
pub fn parse_cgroup_v2_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// The cgroup v1 memory controller's path of a `/proc/self/cgroup` file (the line whose
/// controller list names `memory`).
pub fn parse_cgroup_v1_memory_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_string())
    })
}

/// A cgroup limit or usage in bytes: `None` for `max` (v2's "no limit"), for v1's "no
/// limit" (a value of 2^60 or more: the page-rounded `i64::MAX`) and for anything
/// unreadable.
pub fn parse_cgroup_bytes(s: &str) -> Option<u64> {
    let v: u64 = s.trim().parse().ok()?;
    (v < 1 << 60).then_some(v)
}

/// A `Key:   1234 kB` field of `/proc/meminfo` or `/proc/self/status`, in bytes.
pub fn parse_kib_field(text: &str, key: &str) -> Option<u64> {
    let rest = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    let mut words = rest.split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(n * 1024),
        Some(_) => None,
    }
}

/// The selected mode of a `/sys/kernel/mm/transparent_hugepage/enabled` file
/// (`always [madvise] never` → `madvise`).
pub fn parse_thp_mode(s: &str) -> Option<String> {
    let start = s.find('[')? + 1;
    let end = start + s[start..].find(']')?;
    Some(s[start..end].to_string())
}

/// The tightest cgroup v2 headroom over the cgroup at `path` (under `root`) and its
/// ancestors, with the directory whose limit binds; `read` returns a file's contents.
pub fn cgroup_v2_headroom(
    root: &Path,
    path: &str,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<(u64, PathBuf)> {
    let mut best: Option<(u64, PathBuf)> = None;
    let mut rel = path.trim_end_matches('/').to_string();
    loop {
        let dir = root.join(rel.trim_start_matches('/'));
        let max = read(&dir.join("memory.max")).and_then(|s| parse_cgroup_bytes(&s));
        let cur = read(&dir.join("memory.current")).and_then(|s| parse_cgroup_bytes(&s));
        if let (Some(max), Some(cur)) = (max, cur) {
            let room = max.saturating_sub(cur);
            if best.as_ref().is_none_or(|b| room < b.0) {
                best = Some((room, dir));
            }
        }
        match rel.rfind('/') {
            Some(i) if !rel.is_empty() => rel.truncate(i),
            _ => break,
        }
    }
    best
}

/// The cgroup v1 memory headroom of the cgroup at `path` under `root` (the memory
/// controller's mount), with its directory; `None` without a limit.
pub fn cgroup_v1_headroom(
    root: &Path,
    path: &str,
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<(u64, PathBuf)> {
    let dir = root.join(path.trim_start_matches('/'));
    let limit = parse_cgroup_bytes(&read(&dir.join("memory.limit_in_bytes"))?)?;
    let usage = parse_cgroup_bytes(&read(&dir.join("memory.usage_in_bytes"))?)?;
    Some((limit.saturating_sub(usage), dir))
}

/// Available memory from the files `read` returns (paths as on Linux): see the module docs.
pub fn available_memory_from(read: &dyn Fn(&Path) -> Option<String>) -> Option<Available> {
    let proc_cgroup = read(Path::new("/proc/self/cgroup")).unwrap_or_default();
    let mut candidates: Vec<(u64, MemorySource)> = Vec::new();
    if let Some(p) = parse_cgroup_v2_path(&proc_cgroup)
        && let Some((room, dir)) = cgroup_v2_headroom(Path::new("/sys/fs/cgroup"), &p, read)
    {
        candidates.push((room, MemorySource::CgroupV2(dir)));
    }
    if let Some(p) = parse_cgroup_v1_memory_path(&proc_cgroup)
        && let Some((room, dir)) = cgroup_v1_headroom(Path::new("/sys/fs/cgroup/memory"), &p, read)
    {
        candidates.push((room, MemorySource::CgroupV1(dir)));
    }
    if let Some(a) =
        read(Path::new("/proc/meminfo")).and_then(|s| parse_kib_field(&s, "MemAvailable"))
    {
        candidates.push((a, MemorySource::MemAvailable));
    }
    let (raw, source) = candidates.into_iter().min_by_key(|c| c.0)?;
    Some(Available {
        raw,
        margin: margin_for(raw),
        source,
    })
}

fn read_file(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The memory this process may still use (module docs); `None` where nothing says.
pub fn available_memory() -> Option<Available> {
    available_memory_from(&read_file)
}

/// This process's resident set (`VmRSS` of `/proc/self/status`), bytes.
pub fn resident_bytes() -> Option<u64> {
    parse_kib_field(&read_file(Path::new("/proc/self/status"))?, "VmRSS")
}

/// Settings of this machine that slow decoding, one sentence each: transparent huge pages
/// off (`never`: repacked weights stay on 4 KiB pages) and a `powersave` CPU frequency
/// governor (cpu0's). Empty where the files do not exist.
pub fn slow_settings() -> Vec<String> {
    slow_settings_from(&read_file)
}

/// [`slow_settings`] from the files `read` returns.
pub fn slow_settings_from(read: &dyn Fn(&Path) -> Option<String>) -> Vec<String> {
    let mut out = Vec::new();
    let thp = "/sys/kernel/mm/transparent_hugepage/enabled";
    if read(Path::new(thp))
        .and_then(|s| parse_thp_mode(&s))
        .as_deref()
        == Some("never")
    {
        out.push(format!(
            "transparent huge pages are off ({thp}: never): decoding may be slower"
        ));
    }
    let gov = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor";
    if read(Path::new(gov)).as_deref().map(str::trim) == Some("powersave") {
        out.push(format!(
            "the CPU frequency governor is powersave ({gov}): speeds will be lower and vary"
        ));
    }
    out
}

#[cfg(test)]
mod tests;
