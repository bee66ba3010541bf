//! Priority lanes against FIFO over HTTP: with bulk requests (long prompts) saturating the
//! engine, an interactive request's time to first token is far lower under the priority
//! scheduler than under `--scheduler fifo`. Prints the measured times.

mod common;

use common::*;
use mica::engine::{SchedulePolicy, SchedulerConfig};
use serde_json::json;
use std::io::BufReader;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Sends a streaming completion and returns the time to its first content chunk.
fn ttft(a: SocketAddr, prompt: &str, lane: &str, max_tokens: usize) -> Duration {
    let t0 = Instant::now();
    let body = json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens,
                      "temperature": 0, "stream": true, "priority": lane});
    let s = send(a, "POST", "/v1/completions", &[], &body.to_string());
    let mut r = BufReader::new(s);
    let (status, _) = read_head(&mut r);
    assert_eq!(status, 200);
    let first = read_chunk(&mut r).expect("a first chunk");
    assert!(first.starts_with("data: {"), "{first:?}");
    let t = t0.elapsed();
    while read_chunk(&mut r).is_some() {}
    t
}

fn interactive_ttft_under_bulk(policy: SchedulePolicy) -> Duration {
    let srv = start(config(
        SchedulerConfig {
            policy,
            ..Default::default()
        },
        vec![],
    ));
    let a = srv.addr;
    let bulk: Vec<_> = (0..3)
        .map(|i| {
            let prompt = format!("Record {i}: ") + &"alpha beta gamma delta ".repeat(150);
            std::thread::spawn(move || ttft(a, &prompt, "bulk", 16))
        })
        .collect();
    // Let the bulk prompts get going before the interactive request arrives.
    std::thread::sleep(Duration::from_millis(300));
    let t = ttft(a, "What is 2 + 2?", "interactive", 4);
    for b in bulk {
        b.join().unwrap();
    }
    t
}

#[test]
fn interactive_first_token_beats_fifo_under_bulk_load() {
    let prio = interactive_ttft_under_bulk(SchedulePolicy::Priority);
    let fifo = interactive_ttft_under_bulk(SchedulePolicy::Fifo);
    eprintln!(
        "interactive TTFT under bulk load: priority {:.3} s, fifo {:.3} s ({:.1}x)",
        prio.as_secs_f64(),
        fifo.as_secs_f64(),
        fifo.as_secs_f64() / prio.as_secs_f64()
    );
    assert!(
        fifo > prio * 2,
        "priority {prio:?} should be far below fifo {fifo:?}"
    );
}
