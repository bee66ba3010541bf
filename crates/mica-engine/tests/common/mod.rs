//! Helpers shared by the integration tests: locating test models (shared with the mica-models
//! tests) and fixtures.
#![allow(dead_code)]

#[path = "../../../mica-models/tests/common/models.rs"]
mod models;

pub use models::*;

/// A fixture under `<workspace>/fixtures`, parsed as JSON.
pub fn fixture(rel: &str) -> serde_json::Value {
    let path = workspace().join("fixtures").join(rel);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("an array of ids")
        .iter()
        .map(|x| x.as_u64().expect("an id") as u32)
        .collect()
}

/// Threads for model tests: all cores (the machine running tests has at least 2).
pub fn threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}
