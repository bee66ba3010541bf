//! `/metrics`: the Prometheus text exposition of every engine, merged, plus the server's own
//! counters.
//!
//! Each engine renders its own metrics labelled `model="NAME"`. The server sums them by
//! series ([`Exposition`]) so that
//! - every metric family appears once, with one `# HELP` and `# TYPE` line, however many
//!   models are loaded;
//! - counters and histograms stay monotonic across unloads and reloads: when an engine
//!   stops, its final counters are kept ([`crate::state::Registry::past`]) and added to
//!   those of the model's next engine; gauges (queue depth, KV blocks in use) come from
//!   running engines only.

use crate::state::AppState;
use std::fmt::Write;

/// One metric family: its help, type and series (`name{labels}` → value), in order of
/// first appearance.
#[derive(Clone, Debug, Default)]
struct Family {
    name: String,
    help: String,
    kind: String,
    series: Vec<(String, f64)>,
}

/// Samples of Prometheus text expositions, summed by series.
#[derive(Clone, Debug, Default)]
pub struct Exposition {
    families: Vec<Family>,
}

impl Exposition {
    fn family(&mut self, name: &str) -> &mut Family {
        if let Some(i) = self.families.iter().position(|f| f.name == name) {
            return &mut self.families[i];
        }
        self.families.push(Family {
            name: name.to_string(),
            ..Default::default()
        });
        self.families.last_mut().expect("just pushed")
    }

    /// Adds one series' value.
    pub fn add(&mut self, family: &str, help: &str, kind: &str, series: String, v: f64) {
        let f = self.family(family);
        if f.help.is_empty() {
            f.help = help.to_string();
            f.kind = kind.to_string();
        }
        match f.series.iter_mut().find(|(k, _)| *k == series) {
            Some((_, x)) => *x += v,
            None => f.series.push((series, v)),
        }
    }

    /// Adds the samples of a text exposition; with `cumulative_only`, only those of
    /// counters and histograms.
    pub fn add_text(&mut self, text: &str, cumulative_only: bool) {
        let mut current: Option<(String, String, String)> = None;
        let mut help = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                help = rest.split_once(' ').map_or("", |(_, h)| h).to_string();
                continue;
            }
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    current = Some((
                        name.to_string(),
                        std::mem::take(&mut help),
                        kind.to_string(),
                    ));
                }
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let (Some((family, help, kind)), Ok(v)) = (&current, value.parse::<f64>()) else {
                continue;
            };
            if cumulative_only && kind != "counter" && kind != "histogram" {
                continue;
            }
            self.add(family, help, kind, series.to_string(), v);
        }
    }

    /// Adds every series of `other`.
    pub fn merge(&mut self, other: &Exposition) {
        for f in &other.families {
            for (s, v) in &f.series {
                self.add(&f.name, &f.help, &f.kind, s.clone(), *v);
            }
        }
    }

    /// The value of a series, if present.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.families
            .iter()
            .flat_map(|f| &f.series)
            .find(|(k, _)| k == series)
            .map(|(_, v)| *v)
    }

    pub fn render(&self, out: &mut String) {
        for f in &self.families {
            let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
            let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
            for (s, v) in &f.series {
                if v.fract() == 0.0 && v.abs() < 1e15 {
                    let _ = writeln!(out, "{s} {}", *v as i64);
                } else {
                    let _ = writeln!(out, "{s} {v}");
                }
            }
        }
    }
}

pub(crate) fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"")
}

/// The whole `/metrics` text.
pub fn render(st: &AppState) -> String {
    let mut e = Exposition::default();
    {
        let r = st.registry();
        e.add(
            "mica_models_loaded",
            "Models loaded.",
            "gauge",
            "mica_models_loaded".into(),
            r.loaded.len() as f64,
        );
        for (name, [ok, failed, unloaded]) in &r.loads {
            let m = label(name);
            for (result, v) in [("ok", ok), ("error", failed)] {
                e.add(
                    "mica_model_loads_total",
                    "Model loads by result.",
                    "counter",
                    format!("mica_model_loads_total{{model=\"{m}\",result=\"{result}\"}}"),
                    *v as f64,
                );
            }
            e.add(
                "mica_model_unloads_total",
                "Models unloaded to make room.",
                "counter",
                format!("mica_model_unloads_total{{model=\"{m}\"}}"),
                *unloaded as f64,
            );
        }
        e.merge(&r.past);
        let mut text = String::new();
        for m in r.loaded.iter().map(|(m, _)| m).chain(&r.retired) {
            text.clear();
            m.engine.metrics().render(&m.name, &mut text);
            e.add_text(&text, false);
        }
    }
    crate::streaming::render_metrics(st, &mut e);
    for (code, n) in st
        .responses
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
    {
        e.add(
            "mica_http_responses_total",
            "HTTP responses by status code.",
            "counter",
            format!("mica_http_responses_total{{code=\"{code}\"}}"),
            *n as f64,
        );
    }
    e.add(
        "mica_http_requests_in_flight",
        "Requests being answered.",
        "gauge",
        "mica_http_requests_in_flight".into(),
        st.life.in_flight() as f64,
    );
    e.add(
        "mica_draining",
        "1 while the server shuts down.",
        "gauge",
        "mica_draining".into(),
        f64::from(u8::from(st.life.is_draining())),
    );
    let mut out = String::new();
    e.render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::Exposition;

    const A: &str = "# HELP c_total Things.\n# TYPE c_total counter\nc_total{model=\"a\"} 3\n\
                     # HELP g Level.\n# TYPE g gauge\ng{model=\"a\"} 7\n\
                     # HELP h Latency.\n# TYPE h histogram\nh_bucket{model=\"a\",le=\"+Inf\"} 2\nh_sum{model=\"a\"} 0.5\nh_count{model=\"a\"} 2\n";

    #[test]
    fn sums_by_series_and_keeps_one_header() {
        let mut e = Exposition::default();
        e.add_text(A, false);
        e.add_text(&A.replace("\"a\"", "\"b\""), false);
        let mut past = Exposition::default();
        past.add_text(A, true);
        assert_eq!(past.get("g{model=\"a\"}"), None, "gauges are not kept");
        e.merge(&past);
        assert_eq!(e.get("c_total{model=\"a\"}"), Some(6.0));
        assert_eq!(e.get("c_total{model=\"b\"}"), Some(3.0));
        assert_eq!(e.get("h_sum{model=\"a\"}"), Some(1.0));
        assert_eq!(e.get("g{model=\"a\"}"), Some(7.0));
        let mut out = String::new();
        e.render(&mut out);
        assert_eq!(out.matches("# TYPE c_total counter").count(), 1);
        assert!(
            out.contains("h_bucket{model=\"a\",le=\"+Inf\"} 4\n"),
            "{out}"
        );
    }
}
