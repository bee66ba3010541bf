//! `mica list`: the store's models (or the catalog) as a table. `mica-hub` finds the
//! models; this module describes each one, reading a GGUF's header for the architecture and
//! quantization and a safetensors repository's `config.json`, and prints.

use std::fs;

use anyhow::Result;
use indicatif::HumanBytes;
use mica::hub::{Installed, Kind, Store, catalog};

/// `mica list`: one row per installed model.
pub fn print_installed(store: &Store) -> Result<()> {
    let all = store.list()?;
    if all.is_empty() {
        println!(
            "no models in {}; `mica pull NAME` fetches one (`mica list --catalog` shows the names)",
            store.dir().display()
        );
        return Ok(());
    }
    let rows: Vec<[String; 5]> = all
        .iter()
        .map(|m| {
            let (arch, quant) = describe(m);
            let kind = match m.kind {
                Kind::Gguf => "gguf",
                Kind::Safetensors => "safetensors",
            };
            [
                m.name.clone(),
                HumanBytes(m.size).to_string(),
                kind.to_string(),
                arch,
                quant,
            ]
        })
        .collect();
    print_table(&["NAME", "SIZE", "TYPE", "ARCH", "QUANT"], &rows);
    Ok(())
}

/// `mica list --catalog`: the names `mica pull` knows, marking the installed ones.
pub fn print_catalog(store: &Store) {
    let all = store.list().unwrap_or_default();
    let rows: Vec<[String; 5]> = catalog::CATALOG
        .iter()
        .map(|e| {
            let here = all.iter().any(|m| m.name == e.name);
            let size = HumanBytes(e.size).to_string();
            [
                format!("{}{}", e.name, if here { " *" } else { "" }),
                if e.sha256.is_some() {
                    size
                } else {
                    format!("~{size}")
                },
                e.license.to_string(),
                e.description.to_string(),
                String::new(),
            ]
        })
        .collect();
    print_table(&["NAME", "SIZE", "LICENSE", "DESCRIPTION", ""], &rows);
    println!("(* = in the store; also: mica pull hf:ORG/REPO[:FILE])");
}

/// (architecture, quantization) of a model, or placeholders when they cannot be read.
fn describe(m: &Installed) -> (String, String) {
    match m.kind {
        Kind::Gguf => match mica::formats::GgufFile::open(&m.path) {
            Ok(g) => (
                g.get_str("general.architecture").unwrap_or("?").to_string(),
                g.get_u32("general.file_type")
                    .map_or_else(|| "?".to_string(), mica::formats::gguf::file_type_name),
            ),
            Err(_) => ("(unreadable)".into(), "-".into()),
        },
        Kind::Safetensors => {
            let config = fs::read_to_string(m.path.join("config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok());
            let get = |k: &str| {
                config
                    .as_ref()
                    .and_then(|c| c.get(k))
                    .map(|v| match v {
                        serde_json::Value::Array(a) => a.first().cloned().unwrap_or_default(),
                        v => v.clone(),
                    })
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_else(|| "?".into())
            };
            let dtype = get("torch_dtype");
            (get("architectures"), dtype)
        }
    }
}

pub(crate) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N || cells[i + 1..].iter().all(|c| c.is_empty()) {
                s.push_str(cell);
                break;
            }
            s.push_str(&format!("{cell:<w$}  "));
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}
