//! A Chrome trace-event file (what `--trace` writes) summed into a flame tree: every span's
//! time added to the node of its stack of names (thread, then outermost span to it), so a
//! node's time is what its span took over the whole run and its children's times fit in it.

use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::collections::HashMap;

/// One stack of span names, summed.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub name: String,
    /// Microseconds over every occurrence.
    pub total_us: f64,
    /// Occurrences (spans entered and left).
    pub count: u64,
    /// In order of first appearance.
    pub children: Vec<Node>,
}

impl Node {
    fn new(name: &str) -> Node {
        Node {
            name: name.to_string(),
            total_us: 0.0,
            count: 0,
            children: Vec::new(),
        }
    }

    fn child(&mut self, name: &str) -> &mut Node {
        match self.children.iter().position(|c| c.name == name) {
            Some(i) => &mut self.children[i],
            None => {
                self.children.push(Node::new(name));
                self.children.last_mut().unwrap()
            }
        }
    }

    /// Time not spent in a child span.
    pub fn self_us(&self) -> f64 {
        (self.total_us - self.children.iter().map(|c| c.total_us).sum::<f64>()).max(0.0)
    }

    /// Levels below this node, this one included.
    pub fn depth(&self) -> usize {
        1 + self.children.iter().map(Node::depth).max().unwrap_or(0)
    }
}

/// A trace summed: the root (`all`) has a child per thread track, named as the trace names
/// the thread, whose time is the sum of its outermost spans.
#[derive(Debug)]
pub struct Profile {
    pub root: Node,
    /// Spans entered but never left (a run cut off before its trace was flushed).
    pub open_spans: usize,
}

impl Profile {
    /// Parses a Chrome trace-event JSON text: an array of events, or an object with a
    /// `traceEvents` array. Only duration events (`B`/`E` pairs, and `X` with `dur`) and
    /// thread names are read.
    pub fn parse(text: &str) -> Result<Profile> {
        let json: Value = serde_json::from_str(text)
            .context("not a Chrome trace: the file is not JSON (a trace cut off before `mica` exited is not closed)")?;
        let events = match &json {
            Value::Array(a) => a,
            Value::Object(o) => match o.get("traceEvents") {
                Some(Value::Array(a)) => a,
                _ => bail!("not a Chrome trace: an object without a `traceEvents` array"),
            },
            _ => bail!("not a Chrome trace: neither an array of events nor an object"),
        };
        let mut names: HashMap<String, String> = HashMap::new();
        for e in events {
            if e["ph"] == "M"
                && e["name"] == "thread_name"
                && let Some(n) = e["args"]["name"].as_str()
            {
                names.insert(track(e), n.to_string());
            }
        }
        let mut root = Node::new("all");
        // Per track: the open spans (name, start).
        let mut stacks: HashMap<String, Vec<(String, f64)>> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let Some(ph) = e["ph"].as_str() else {
                bail!("trace event {i} has no `ph` (phase)");
            };
            if !matches!(ph, "B" | "E" | "X") {
                continue;
            }
            let ts = e["ts"]
                .as_f64()
                .with_context(|| format!("trace event {i} ({ph}) has no numeric `ts`"))?;
            let name = e["name"].as_str().unwrap_or("");
            let tid = track(e);
            let thread = names.get(&tid).cloned().unwrap_or_else(|| tid.clone());
            if !stacks.contains_key(&tid) {
                // Threads in order of their first event.
                root.child(&thread);
                order.push(tid.clone());
            }
            let stack = stacks.entry(tid.clone()).or_default();
            match ph {
                "B" => stack.push((name.to_string(), ts)),
                "E" => {
                    let Some((open, start)) = stack.pop() else {
                        bail!(
                            "trace event {i}: `{name}` ends on thread {thread} with no span open"
                        );
                    };
                    if !name.is_empty() && name != open {
                        bail!(
                            "trace event {i}: `{name}` ends on thread {thread} while `{open}` is open"
                        );
                    }
                    add(&mut root, &thread, stack, &open, ts - start);
                }
                _ => {
                    let dur = e["dur"]
                        .as_f64()
                        .with_context(|| format!("trace event {i} (X) has no numeric `dur`"))?;
                    add(&mut root, &thread, stack, name, dur);
                }
            }
        }
        // A track whose spans never closed has nothing to show.
        root.children.retain(|t| !t.children.is_empty());
        if root.children.is_empty() {
            bail!("the trace has no spans (no complete B/E pair nor X event)");
        }
        root.total_us = root.children.iter().map(|c| c.total_us).sum();
        root.count = 1;
        let open_spans = order.iter().map(|t| stacks[t].len()).sum();
        Ok(Profile { root, open_spans })
    }

    /// Per span name over the whole trace: (name, occurrences, total µs, self µs), by total
    /// time, largest first. A name nested in itself counts its inner occurrences' time once.
    pub fn by_name(&self) -> Vec<(String, u64, f64, f64)> {
        fn walk(n: &Node, outer: &mut Vec<String>, acc: &mut Vec<(String, u64, f64, f64)>) {
            let i = match acc.iter().position(|a| a.0 == n.name) {
                Some(i) => i,
                None => {
                    acc.push((n.name.clone(), 0, 0.0, 0.0));
                    acc.len() - 1
                }
            };
            acc[i].1 += n.count;
            if !outer.contains(&n.name) {
                acc[i].2 += n.total_us;
            }
            acc[i].3 += n.self_us();
            outer.push(n.name.clone());
            for c in &n.children {
                walk(c, outer, acc);
            }
            outer.pop();
        }
        let mut acc = Vec::new();
        for thread in &self.root.children {
            for c in &thread.children {
                walk(c, &mut Vec::new(), &mut acc);
            }
        }
        acc.sort_by(|a, b| b.2.total_cmp(&a.2));
        acc
    }
}

/// A span's track: process and thread id.
fn track(e: &Value) -> String {
    match (&e["pid"], &e["tid"]) {
        (Value::Null, t) => t.to_string(),
        (p, t) => format!("{p}/{t}"),
    }
}

/// Adds one span of `dur` µs, inside the open spans `stack` of `thread`.
fn add(root: &mut Node, thread: &str, stack: &[(String, f64)], name: &str, dur: f64) {
    let t = root.child(thread);
    if stack.is_empty() {
        t.total_us += dur;
        t.count += 1;
    }
    let mut n = t;
    for (s, _) in stack {
        n = n.child(s);
    }
    let n = n.child(name);
    n.total_us += dur;
    n.count += 1;
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = r#"[
        {"ph":"M","pid":1,"name":"thread_name","tid":0,"args":{"name":"main"}},
        {"ph":"B","pid":1,"tid":0,"ts":0,"name":"step"},
        {"ph":"B","pid":1,"tid":0,"ts":1,"name":"forward"},
        {"ph":"B","pid":1,"tid":1,"ts":2,"name":"pool_job"},
        {"ph":"E","pid":1,"tid":1,"ts":4,"name":"pool_job"},
        {"ph":"E","pid":1,"tid":0,"ts":7,"name":"forward"},
        {"ph":"E","pid":1,"tid":0,"ts":10,"name":"step"},
        {"ph":"B","pid":1,"tid":0,"ts":10,"name":"step"},
        {"ph":"X","pid":1,"tid":0,"ts":11,"dur":3,"name":"forward"},
        {"ph":"E","pid":1,"tid":0,"ts":15,"name":"step"},
        {"ph":"B","pid":1,"tid":0,"ts":20,"name":"update"}
    ]"#;

    #[test]
    fn spans_sum_by_stack() {
        let p = Profile::parse(TRACE).unwrap();
        assert_eq!(p.open_spans, 1);
        assert_eq!(p.root.total_us, 17.0);
        let main = &p.root.children[0];
        assert_eq!((main.name.as_str(), main.total_us), ("main", 15.0));
        let step = &main.children[0];
        assert_eq!((step.count, step.total_us), (2, 15.0));
        let fwd = &step.children[0];
        assert_eq!(
            (fwd.name.as_str(), fwd.count, fwd.total_us),
            ("forward", 2, 9.0)
        );
        assert_eq!(step.self_us(), 6.0);
        let worker = &p.root.children[1];
        assert_eq!((worker.name.as_str(), worker.total_us), ("1/1", 2.0));
        assert_eq!(p.root.depth(), 4);
        let names = p.by_name();
        assert_eq!(names[0], ("step".to_string(), 2, 15.0, 6.0));
    }

    #[test]
    fn bad_traces_say_what_is_wrong() {
        let err = |t: &str| format!("{:#}", Profile::parse(t).unwrap_err());
        assert!(err("[{").contains("not JSON"), "{}", err("[{"));
        assert!(err("{}").contains("traceEvents"));
        assert!(err("[]").contains("no spans"));
        assert!(err(r#"[{"ph":"B","tid":0,"ts":1,"name":"a"}]"#).contains("no spans"));
        assert!(err(r#"[{"ph":"E","tid":0,"ts":1,"name":"a"}]"#).contains("no span open"));
        assert!(
            err(r#"[{"ph":"B","tid":0,"ts":1,"name":"a"},{"ph":"E","tid":0,"ts":2,"name":"b"}]"#)
                .contains("while `a` is open")
        );
        assert!(err(r#"[{"ph":"B","tid":0,"name":"a"}]"#).contains("numeric `ts`"));
    }
}
