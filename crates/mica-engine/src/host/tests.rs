//! The parsers and the available-memory choice, on fixed file contents.

use super::*;
use std::collections::HashMap;

/// A fake file system: path → contents.
fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
    let map: HashMap<PathBuf, String> = entries
        .iter()
        .map(|(p, c)| (PathBuf::from(p), c.to_string()))
        .collect();
    move |p: &Path| map.get(p).cloned()
}

const MEMINFO: &str = "MemTotal:       16318568 kB\nMemFree:         1048576 kB\n\
                       MemAvailable:    8388608 kB\nBuffers:          123456 kB\n";

#[test]
fn cgroup_paths_are_parsed() {
    let v2 = "0::/user.slice/user-0.slice/run-r1.scope\n";
    assert_eq!(
        parse_cgroup_v2_path(v2).as_deref(),
        Some("/user.slice/user-0.slice/run-r1.scope")
    );
    assert_eq!(parse_cgroup_v1_memory_path(v2), None);
    let hybrid = "9:name=systemd:/\n4:memory:/process_api/abc\n3:cpuset:/\n0::/\n";
    assert_eq!(
        parse_cgroup_v1_memory_path(hybrid).as_deref(),
        Some("/process_api/abc")
    );
    assert_eq!(parse_cgroup_v2_path(hybrid).as_deref(), Some("/"));
    // Controllers sharing a hierarchy are listed together.
    let joined = "5:cpu,memory:/docker/x\n";
    assert_eq!(
        parse_cgroup_v1_memory_path(joined).as_deref(),
        Some("/docker/x")
    );
    assert_eq!(parse_cgroup_v1_memory_path("5:memoryx:/y\n"), None);
}

#[test]
fn cgroup_values_are_parsed() {
    assert_eq!(parse_cgroup_bytes("536870912\n"), Some(512 << 20));
    assert_eq!(parse_cgroup_bytes("max\n"), None);
    // cgroup v1's "no limit".
    assert_eq!(parse_cgroup_bytes("9223372036854771712\n"), None);
    assert_eq!(parse_cgroup_bytes(""), None);
}

#[test]
fn kib_fields_and_thp_mode_are_parsed() {
    assert_eq!(
        parse_kib_field(MEMINFO, "MemAvailable"),
        Some(8388608 * 1024)
    );
    assert_eq!(parse_kib_field(MEMINFO, "MemFree"), Some(1048576 * 1024));
    assert_eq!(parse_kib_field(MEMINFO, "Mem"), None);
    let status = "Name:\tmica\nVmPeak:\t  300000 kB\nVmRSS:\t  123456 kB\nThreads:\t3\n";
    assert_eq!(parse_kib_field(status, "VmRSS"), Some(123456 * 1024));
    assert_eq!(parse_kib_field(status, "VmSwap"), None);
    assert_eq!(
        parse_thp_mode("always [madvise] never\n").as_deref(),
        Some("madvise")
    );
    assert_eq!(
        parse_thp_mode("always madvise [never]\n").as_deref(),
        Some("never")
    );
    assert_eq!(parse_thp_mode("garbage"), None);
}

#[test]
fn the_tightest_cgroup_v2_ancestor_binds() {
    // The scope has no limit; its slice has 1 GiB with 900 MiB used; the parent slice has
    // 4 GiB with 1 GiB used.
    let read = files(&[
        ("/proc/self/cgroup", "0::/a.slice/b.slice/c.scope\n"),
        ("/sys/fs/cgroup/a.slice/b.slice/c.scope/memory.max", "max\n"),
        (
            "/sys/fs/cgroup/a.slice/b.slice/c.scope/memory.current",
            "104857600\n",
        ),
        ("/sys/fs/cgroup/a.slice/b.slice/memory.max", "1073741824\n"),
        (
            "/sys/fs/cgroup/a.slice/b.slice/memory.current",
            "943718400\n",
        ),
        ("/sys/fs/cgroup/a.slice/memory.max", "4294967296\n"),
        ("/sys/fs/cgroup/a.slice/memory.current", "1073741824\n"),
        ("/proc/meminfo", MEMINFO),
    ]);
    let a = available_memory_from(&read).unwrap();
    assert_eq!(a.raw, 124 << 20);
    assert_eq!(
        a.source,
        MemorySource::CgroupV2(PathBuf::from("/sys/fs/cgroup/a.slice/b.slice"))
    );
    assert_eq!(a.margin, 32 << 20);
    assert_eq!(a.usable(), 92 << 20);
    let shown = a.to_string();
    assert!(
        shown.contains("/sys/fs/cgroup/a.slice/b.slice/memory.max"),
        "{shown}"
    );
    assert!(shown.contains("92.0 MiB available"), "{shown}");
}

#[test]
fn a_container_root_cgroup_limit_counts() {
    // Inside a cgroup namespace the process sits at "/", whose files hold the limit.
    let read = files(&[
        ("/proc/self/cgroup", "0::/\n"),
        ("/sys/fs/cgroup/memory.max", "2147483648\n"),
        ("/sys/fs/cgroup/memory.current", "1073741824\n"),
        ("/proc/meminfo", MEMINFO),
    ]);
    let a = available_memory_from(&read).unwrap();
    assert_eq!(a.raw, 1 << 30);
    assert_eq!(
        a.source,
        MemorySource::CgroupV2(PathBuf::from("/sys/fs/cgroup"))
    );
}

#[test]
fn cgroup_v1_and_meminfo_fallbacks() {
    let v1 = files(&[
        ("/proc/self/cgroup", "4:memory:/job\n0::/\n"),
        (
            "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
            "2147483648\n",
        ),
        (
            "/sys/fs/cgroup/memory/job/memory.usage_in_bytes",
            "536870912\n",
        ),
        ("/proc/meminfo", MEMINFO),
    ]);
    let a = available_memory_from(&v1).unwrap();
    assert_eq!(a.raw, 1536 << 20);
    assert_eq!(
        a.source,
        MemorySource::CgroupV1(PathBuf::from("/sys/fs/cgroup/memory/job"))
    );
    assert_eq!(a.margin, (1536 << 20) / 20);
    // No limit in v1: MemAvailable.
    let unlimited = files(&[
        ("/proc/self/cgroup", "4:memory:/job\n0::/\n"),
        (
            "/sys/fs/cgroup/memory/job/memory.limit_in_bytes",
            "9223372036854771712\n",
        ),
        (
            "/sys/fs/cgroup/memory/job/memory.usage_in_bytes",
            "536870912\n",
        ),
        ("/proc/meminfo", MEMINFO),
    ]);
    let a = available_memory_from(&unlimited).unwrap();
    assert_eq!((a.raw, &a.source), (8 << 30, &MemorySource::MemAvailable));
    // A cgroup limit larger than the machine's free memory: MemAvailable binds.
    let roomy = files(&[
        ("/proc/self/cgroup", "0::/big\n"),
        ("/sys/fs/cgroup/big/memory.max", "68719476736\n"),
        ("/sys/fs/cgroup/big/memory.current", "0\n"),
        ("/proc/meminfo", MEMINFO),
    ]);
    assert_eq!(
        available_memory_from(&roomy).unwrap().source,
        MemorySource::MemAvailable
    );
    assert_eq!(available_memory_from(&files(&[])), None);
}

#[test]
fn slow_settings_are_named() {
    let read = files(&[
        (
            "/sys/kernel/mm/transparent_hugepage/enabled",
            "always madvise [never]\n",
        ),
        (
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
            "powersave\n",
        ),
    ]);
    let w = slow_settings_from(&read);
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("transparent huge pages"));
    assert!(w[1].contains("powersave"));
    let fine = files(&[
        (
            "/sys/kernel/mm/transparent_hugepage/enabled",
            "always [madvise] never\n",
        ),
        (
            "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor",
            "performance\n",
        ),
    ]);
    assert!(slow_settings_from(&fine).is_empty());
    assert!(slow_settings_from(&files(&[])).is_empty());
}

#[test]
fn rss_check_tolerance() {
    let c = RssCheck {
        expected: 100 << 20,
        rss: 109 << 20,
    };
    assert!((c.error_pct() - 9.0).abs() < 1e-9);
    assert!(c.within_tolerance());
    let c = RssCheck {
        expected: 100 << 20,
        rss: 85 << 20,
    };
    assert!(!c.within_tolerance());
    assert!(c.to_string().contains("-15.0%"), "{c}");
}

#[test]
fn the_process_resident_set_is_read() {
    // Linux only: this test process's own VmRSS.
    if cfg!(target_os = "linux") {
        let rss = resident_bytes().expect("VmRSS in /proc/self/status");
        assert!(rss > 1 << 20, "{rss}");
    }
}

#[test]
fn a_measured_figure_already_left_out_the_runtime() {
    let est = MemoryEstimate {
        weights: mica_models::WeightFootprint {
            mapped: 10 << 20,
            repacked: 80 << 20,
            on_demand: 0,
            streamed: 0,
            stream_buffers: 0,
        },
        kv_cache: 40 << 20,
        recurrent_state: 0,
        compute: 20 << 20,
        runtime: 50 << 20,
    };
    // 200 MiB in all; 150 MiB beyond what the process holds.
    assert!(check_fits(&est, &Available::limit(200 << 20)).is_ok());
    let e = check_fits(&est, &Available::limit(199 << 20)).unwrap_err();
    assert!(
        !e.to_string().contains("more than the process holds"),
        "{e}"
    );
    let measured = |raw: u64| Available {
        raw,
        margin: 32 << 20,
        source: MemorySource::MemAvailable,
    };
    assert!(check_fits(&est, &measured(182 << 20)).is_ok());
    let e = check_fits(&est, &measured(181 << 20))
        .unwrap_err()
        .to_string();
    for part in [
        "= 200.0 MiB",
        "150.0 MiB more than the process holds now",
        "only 149.0 MiB available (MemAvailable in /proc/meminfo = 181.0 MiB, less a margin of 32.0 MiB)",
    ] {
        assert!(e.contains(part), "{part:?} missing: {e}");
    }
}
