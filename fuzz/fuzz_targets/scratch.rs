//! The file readers take a path (they memory-map it), so each input is written to a file
//! first: one per fuzzing process, in the RAM-backed /dev/shm when there is one.

use std::path::PathBuf;

/// Writes `data` to this process's scratch file (named with `ext`) and returns its path.
pub fn write(data: &[u8], ext: &str) -> PathBuf {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let path = dir.join(format!("mica-fuzz-{}.{ext}", std::process::id()));
    std::fs::write(&path, data).expect("the scratch file is writable");
    path
}
