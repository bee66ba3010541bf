//! LoRA adapters chosen per request.
//!
//! The adapters of `mica serve --lora NAME=PATH[:SCALE]` ([`ServerConfig::lora`]) are
//! *available* to the requests of a model, not applied to all of them: each is opened for a
//! model when the model loads (an adapter that does not fit fails the load), under the id of
//! its place on the command line (0, 1, …) and its name. Adapters loaded at run time
//! (`POST /admin/lora-adapters`) take the next ids; unloading one (`DELETE
//! /admin/lora-adapters/{name}`) lets the requests running with it finish with it (they hold
//! it) while new requests can no longer name it.
//!
//! A request selects adapters with llama-server's `lora` list (`[{"id": 0, "scale": 0.5}]`,
//! or `"name"` for `"id"`; the scale defaults to the adapter's `--lora` scale), or with a
//! model name of the form `MODEL:ADAPTER` (vLLM's form, the adapter at its default scale),
//! or both (the model name's adapter first). The engine runs requests with different
//! adapters, and none, in the same steps ([`mica::models::lora::LoraSelection`]), and keys
//! the prefix cache by the selection.
//!
//! [`ServerConfig::lora`]: crate::ServerConfig

use crate::error::ParamError;
use crate::state::AppState;
use mica::models::lora::LoraSelection;
use mica::models::{LoadedModel, LoraAdapter, LoraSpec};
use serde::Serialize;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

/// An adapter a model's requests may select.
pub struct ServedAdapter {
    /// llama-server's id: the place on the command line, then the order of loading.
    pub id: usize,
    pub model: String,
    pub name: String,
    pub path: PathBuf,
    /// The scale a request that names no scale gets.
    pub scale: f32,
    /// Opened at scale 1 (a request's scale multiplies its own `alpha / r`).
    pub adapter: Arc<LoraAdapter>,
}

/// The adapters of every model.
#[derive(Default)]
pub struct Adapters {
    list: Vec<Arc<ServedAdapter>>,
    /// The next id of an adapter loaded at run time.
    next_id: usize,
}

impl Adapters {
    pub fn new(configured: usize) -> Adapters {
        Adapters {
            list: Vec::new(),
            next_id: configured,
        }
    }

    fn find(&self, model: &str, name: &str) -> Option<&Arc<ServedAdapter>> {
        self.list
            .iter()
            .find(|a| a.model == model && a.name == name)
    }

    /// The adapters of `model`, by id.
    pub fn of(&self, model: &str) -> Vec<Arc<ServedAdapter>> {
        let mut v: Vec<_> = self
            .list
            .iter()
            .filter(|a| a.model == model)
            .cloned()
            .collect();
        v.sort_by_key(|a| a.id);
        v
    }
}

/// What `GET /admin/lora-adapters` shows of an adapter.
#[derive(Serialize)]
pub struct AdapterInfo {
    pub id: usize,
    pub name: String,
    pub model: String,
    pub path: String,
    pub scale: f32,
    pub rank: usize,
    pub targets: usize,
    /// Requests running with it now.
    pub in_use: usize,
}

impl ServedAdapter {
    pub fn info(&self) -> AdapterInfo {
        AdapterInfo {
            id: self.id,
            name: self.name.clone(),
            model: self.model.clone(),
            path: self.path.display().to_string(),
            scale: self.scale,
            rank: self.adapter.rank,
            targets: self.adapter.targets.len(),
            // The list holds one reference; each running request's selection another.
            in_use: Arc::strong_count(&self.adapter) - 1,
        }
    }
}

/// Opens `spec`'s adapter for `lm` (at scale 1: the spec's scale is the default of requests).
pub fn open(spec: &LoraSpec, lm: &LoadedModel) -> Result<LoraAdapter, String> {
    LoraAdapter::open(&spec.path, &lm.model, 1.0)
        .map_err(|e| format!("LoRA adapter {}: {e}", spec.path.display()))
}

impl AppState {
    pub(crate) fn adapters(&self) -> std::sync::MutexGuard<'_, Adapters> {
        self.lora.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The configured model `name` names and the adapter it selects: `name` itself, or
    /// `MODEL:ADAPTER` when `name` is not a model but `MODEL` is.
    pub fn split_model<'a>(&self, name: &'a str) -> (&'a str, Option<&'a str>) {
        let known = |n: &str| self.cfg.models.iter().any(|m| m.0 == n);
        if !known(name)
            && let Some((m, a)) = name.rsplit_once(':')
            && known(m)
        {
            return (m, Some(a));
        }
        (name, None)
    }

    /// `MODEL:ADAPTER` for every adapter of every model (the `--lora` ones of models not
    /// loaded yet too), as `/v1/models` lists them.
    pub fn adapter_model_names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for m in self.model_names() {
            let opened = self.adapters().of(&m);
            let configured = self.cfg.lora.iter().map(LoraSpec::name);
            for a in configured.filter(|n| !opened.iter().any(|o| o.name == *n)) {
                names.push(format!("{m}:{a}"));
            }
            names.extend(opened.iter().map(|a| format!("{m}:{}", a.name)));
        }
        names
    }

    /// Refuses a model name that selects an adapter (`MODEL:ADAPTER`) where adapters do not
    /// apply (embeddings).
    pub fn no_adapter(&self, model_field: &str) -> Result<(), ParamError> {
        match self.split_model(model_field) {
            (m, Some(a)) => Err(ParamError::Unsupported {
                field: "model".into(),
                message: format!(
                    "LoRA adapters apply to generation only: embed with '{m}', not with adapter '{a}'"
                ),
            }),
            _ => Ok(()),
        }
    }

    /// Opens the `--lora` adapters for `model` (loading as `lm`) that it does not have yet.
    pub(crate) fn open_configured(&self, model: &str, lm: &LoadedModel) -> Result<(), String> {
        for (id, spec) in self.cfg.lora.iter().enumerate() {
            let name = spec.name();
            if self.adapters().find(model, &name).is_some() {
                continue;
            }
            let adapter = Arc::new(open(spec, lm)?);
            self.adapters().list.push(Arc::new(ServedAdapter {
                id,
                model: model.to_string(),
                name,
                path: spec.path.clone(),
                scale: spec.scale,
                adapter,
            }));
        }
        Ok(())
    }

    /// Adds an adapter opened at run time; `Err` names the adapter of that name already
    /// there.
    pub(crate) fn add_adapter(
        &self,
        model: &str,
        spec: &LoraSpec,
        adapter: LoraAdapter,
    ) -> Result<Arc<ServedAdapter>, String> {
        let mut a = self.adapters();
        let name = spec.name();
        if a.find(model, &name).is_some() {
            return Err(format!(
                "model '{model}' already has a LoRA adapter named '{name}' (unload it first)"
            ));
        }
        let served = Arc::new(ServedAdapter {
            id: a.next_id,
            model: model.to_string(),
            name,
            path: spec.path.clone(),
            scale: spec.scale,
            adapter: Arc::new(adapter),
        });
        a.next_id += 1;
        a.list.push(served.clone());
        Ok(served)
    }

    /// Removes adapter `name` of `model`; requests running with it keep it until they end.
    pub(crate) fn remove_adapter(&self, model: &str, name: &str) -> Option<Arc<ServedAdapter>> {
        let mut a = self.adapters();
        let i = a
            .list
            .iter()
            .position(|x| x.model == model && x.name == name)?;
        Some(a.list.remove(i))
    }

    /// The adapters a request for `model_field` (`MODEL` or `MODEL:ADAPTER`) with the
    /// `lora` entries `refs` runs with; `None` for none.
    pub fn lora_selection(
        &self,
        model_field: &str,
        refs: &[LoraRef],
    ) -> Result<Option<Arc<LoraSelection>>, ParamError> {
        let (model, by_name) = self.split_model(model_field);
        if by_name.is_none() && refs.is_empty() {
            return Ok(None);
        }
        let served = self.adapters().of(model);
        let names = || {
            let list: Vec<String> = served
                .iter()
                .map(|a| format!("{} ({})", a.id, a.name))
                .collect();
            if list.is_empty() {
                "it has none".to_string()
            } else {
                format!("it has {}", list.join(", "))
            }
        };
        let mut adapters = Vec::new();
        if let Some(n) = by_name {
            let a = served
                .iter()
                .find(|a| a.name == n)
                .ok_or_else(|| ParamError::Unsupported {
                    field: "model".into(),
                    message: format!(
                        "model '{model}' has no LoRA adapter named '{n}' ({})",
                        names()
                    ),
                })?;
            adapters.push((a.adapter.clone(), a.scale));
        }
        for (i, r) in refs.iter().enumerate() {
            let (field, a) = match &r.adapter {
                AdapterRef::Id(id) => {
                    (format!("lora[{i}].id"), served.iter().find(|a| a.id == *id))
                }
                AdapterRef::Name(n) => (
                    format!("lora[{i}].name"),
                    served.iter().find(|a| a.name == *n),
                ),
            };
            let a = a.ok_or_else(|| ParamError::Unsupported {
                message: format!(
                    "model '{model}' has no LoRA adapter {} ({})",
                    match &r.adapter {
                        AdapterRef::Id(id) => format!("with id {id}"),
                        AdapterRef::Name(n) => format!("named '{n}'"),
                    },
                    names()
                ),
                field,
            })?;
            adapters.push((a.adapter.clone(), r.scale.unwrap_or(a.scale)));
        }
        Ok(Some(Arc::new(LoraSelection { adapters })))
    }
}

/// How a `lora` entry names its adapter.
#[derive(Clone, Debug, PartialEq)]
pub enum AdapterRef {
    Id(usize),
    Name(String),
}

/// One entry of a request's `lora` list.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraRef {
    pub adapter: AdapterRef,
    /// `None`: the adapter's default scale.
    pub scale: Option<f32>,
}

/// Reads a request's `lora` field (`field` names it in errors): a list of objects, each
/// with `id` (a non-negative integer) or `name`, and an optional finite `scale`.
pub fn parse_refs(v: Option<&Value>, field: &str) -> Result<Vec<LoraRef>, ParamError> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(l)) => l,
        Some(other) => {
            return Err(ParamError::Invalid {
                field: field.into(),
                rule: "a list of {\"id\" or \"name\", \"scale\"} objects",
                got: other.to_string(),
            });
        }
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, e) in list.iter().enumerate() {
        let at = |k: &str| format!("{field}[{i}]{k}");
        let Some(o) = e.as_object() else {
            return Err(ParamError::Invalid {
                field: at(""),
                rule: "an object with \"id\" or \"name\" and \"scale\"",
                got: e.to_string(),
            });
        };
        let adapter = match (o.get("id"), o.get("name")) {
            (Some(id), None) => {
                AdapterRef::Id(id.as_u64().map(|v| v as usize).ok_or_else(|| {
                    ParamError::Invalid {
                        field: at(".id"),
                        rule: "a non-negative integer",
                        got: id.to_string(),
                    }
                })?)
            }
            (None, Some(n)) => AdapterRef::Name(
                n.as_str()
                    .ok_or_else(|| ParamError::Invalid {
                        field: at(".name"),
                        rule: "a string",
                        got: n.to_string(),
                    })?
                    .to_string(),
            ),
            (Some(_), Some(_)) => {
                return Err(ParamError::Unsupported {
                    field: at(""),
                    message: "give \"id\" or \"name\", not both".into(),
                });
            }
            (None, None) => return Err(ParamError::Missing { field: at(".id") }),
        };
        let scale = match o.get("scale") {
            None | Some(Value::Null) => None,
            Some(s) => Some(parse_scale(s, &at(".scale"))?),
        };
        if let Some(k) = o
            .keys()
            .find(|k| !["id", "name", "scale"].contains(&k.as_str()))
        {
            return Err(ParamError::Unsupported {
                field: at(&format!(".{k}")),
                message: "unknown field (a lora entry has \"id\" or \"name\", and \"scale\")"
                    .into(),
            });
        }
        out.push(LoraRef { adapter, scale });
    }
    Ok(out)
}

/// A finite scale (`field` names it in the error).
pub fn parse_scale(v: &Value, field: &str) -> Result<f32, ParamError> {
    let bad = || ParamError::Invalid {
        field: field.into(),
        rule: "a finite number",
        got: v.to_string(),
    };
    let s = v.as_f64().ok_or_else(bad)? as f32;
    if s.is_finite() { Ok(s) } else { Err(bad()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lora_lists_parse_and_bad_ones_name_the_field() {
        let refs = parse_refs(
            Some(&json!([{"id": 1, "scale": 0.5}, {"name": "b"}])),
            "lora",
        )
        .unwrap();
        assert_eq!(
            refs,
            vec![
                LoraRef {
                    adapter: AdapterRef::Id(1),
                    scale: Some(0.5)
                },
                LoraRef {
                    adapter: AdapterRef::Name("b".into()),
                    scale: None
                }
            ]
        );
        assert!(parse_refs(None, "lora").unwrap().is_empty());
        let err = |v: Value| parse_refs(Some(&v), "lora").unwrap_err().to_string();
        assert!(err(json!({"id": 0})).contains("lora must be a list"));
        assert!(err(json!([{"id": -1}])).contains("lora[0].id"));
        assert!(err(json!([{"id": 0, "name": "a"}])).contains("not both"));
        assert!(err(json!([{"scale": 1}])).contains("lora[0].id"));
        assert!(err(json!([{"id": 0, "scale": "x"}])).contains("lora[0].scale"));
        assert!(err(json!([{"id": 0, "scale": 1e39}])).contains("finite"));
        assert!(err(json!([{"id": 0, "weight": 1}])).contains("lora[0].weight"));
    }
}
