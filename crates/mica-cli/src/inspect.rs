//! `mica inspect`: what a model file (GGUF) or Hugging Face folder holds.

use anyhow::Result;
use clap::Args;
use mica::formats::{Container, GgufFile, MetaValue, MicaFile};
use mica::models::hf::HfFolder;
use mica::models::tokenizer::Tokenizer;
use mica::models::{LoadOptions, LoadedModel, ModelError, open_tokenizer};
use std::collections::BTreeMap;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Model: a GGUF file, a Hugging Face folder, or a store name (see `mica list`).
    #[arg(value_name = "MODEL", required_unless_present = "kernels")]
    pub model: Option<String>,
    /// Also list every metadata key.
    #[arg(long)]
    pub metadata: bool,
    /// Also list every tensor.
    #[arg(long)]
    pub tensors: bool,
    /// Instead of a model, list this CPU's kernel tables: for each type and path, which
    /// tier has a kernel of its own and which falls back, and the tier selected here.
    #[arg(long, conflicts_with_all = ["model", "metadata", "tensors"])]
    pub kernels: bool,
}

pub fn inspect(args: InspectArgs) -> Result<()> {
    if args.kernels {
        print!("{}", mica::kernels::simd::coverage());
        return Ok(());
    }
    let Some(model) = args.model.as_deref() else {
        anyhow::bail!("inspect needs a model (or --kernels)");
    };
    let file = crate::store::resolve_model(Some(model), false)?;
    if file.is_dir() {
        return inspect_hf(&file, &args);
    }
    let g = GgufFile::open(&file)?;
    println!("file:          {}", file.display());
    println!(
        "format:        {} v{} ({} metadata keys, {} tensors, alignment {})",
        match g.container() {
            Container::Gguf => "GGUF",
            Container::Mica => ".mica",
        },
        g.version(),
        g.metadata_entries().len(),
        g.tensors().len(),
        g.alignment()
    );
    println!("size:          {}", human_bytes(g.file_size()));
    if g.container() == Container::Mica {
        print_provenance(&file)?;
    }
    let arch = g.get_str("general.architecture").unwrap_or("(none)");
    println!("architecture:  {arch}");
    if let Some(n) = g.get_str("general.name") {
        println!("name:          {n}");
    }

    // Build the model to show resolved hyper-parameters; a file mica cannot run still gets
    // described from its raw metadata.
    match LoadedModel::open_with(&file, LoadOptions::READ_ONLY) {
        Ok(lm) => {
            let params: u64 = g.tensors().iter().map(|t| t.n_elements()).sum();
            println!("parameters:    {:.1} M", params as f64 / 1e6);
            resolved(&lm, g.get_str("tokenizer.ggml.model").unwrap_or("?"));
            if let Some(m) = g.get_array("tokenizer.ggml.merges") {
                println!("merges:        {}", m.len());
            }
            for w in lm.tokenizer.warnings() {
                println!("warning:       {w}");
            }
        }
        Err(ModelError::VocabOnly { .. }) => {
            println!("(vocabulary only: no tensors to run; it can tokenize)");
            let t = open_tokenizer(&file)?;
            tokenizer_summary(&t, g.get_str("tokenizer.ggml.model").unwrap_or("?"));
            for w in t.warnings() {
                println!("warning:       {w}");
            }
        }
        Err(e) => println!("(cannot run this file: {e})"),
    }

    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in g.tensors() {
        let e = by_type.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    println!("tensors by type:");
    for (ty, (n, bytes)) in &by_type {
        println!("  {ty:<8} {n:>5} tensors  {:>10}", human_bytes(*bytes));
    }
    match g.get_str("tokenizer.chat_template") {
        Some(tpl) => println!("chat template:\n{tpl}"),
        None => println!("chat template: (none; mica falls back to ChatML, as llama.cpp does)"),
    }
    if args.metadata {
        println!("metadata:");
        for (k, v) in g.metadata_entries() {
            println!("  {k} = {}", short(v));
        }
    }
    if args.tensors {
        println!("tensors:");
        for t in g.tensors() {
            println!(
                "  {:<40} {:<8} {:?} {}",
                t.name,
                t.ggml_type.name(),
                t.shape,
                human_bytes(t.n_bytes)
            );
        }
    }
    Ok(())
}

/// The provenance section of a `.mica` file (the per-tensor recipe summarized).
fn print_provenance(path: &std::path::Path) -> Result<()> {
    let m = MicaFile::open(path)?;
    for (k, v) in m.provenance() {
        match v {
            MetaValue::Array(a) => println!("provenance:    {k} = [{} entries]", a.len()),
            _ => println!("provenance:    {k} = {v}"),
        }
    }
    Ok(())
}

fn short(v: &MetaValue) -> String {
    v.to_string()
}

pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// The hyper-parameters and tokenizer mica resolved for a model it can run.
fn resolved(lm: &LoadedModel, vocab_model: &str) {
    let c = &lm.model.config;
    println!(
        "layers:        {}   embedding {}   feed-forward {}   vocab {}",
        c.n_layer, c.n_embd, c.n_ff, c.n_vocab
    );
    match &c.mla {
        Some(m) => println!(
            "attention:     latent (MLA), {} heads of {} + {} rope (values {}), query rank {}, \
             cached latent {} + {} per token, norm eps {:e}",
            c.n_head,
            m.qk_nope,
            m.qk_rope,
            m.v_head_dim,
            m.q_lora_rank.map_or("full".to_string(), |r| r.to_string()),
            m.kv_lora_rank,
            m.qk_rope,
            c.norm_eps
        ),
        None => println!(
            "attention:     {} heads, {} KV heads, head dim {}, norm eps {:e}",
            c.n_head, c.n_head_kv, c.head_dim, c.norm_eps
        ),
    }
    println!(
        "rope:          {:?}, {} dims, base {}, scale {}{}",
        c.rope.style,
        c.rope.n_dims,
        c.rope.freq_base,
        c.rope.freq_scale,
        if c.rope.freq_factors.is_some() {
            ", frequency factors"
        } else {
            ""
        }
    );
    println!("context:       {} (trained)", c.n_ctx_train);
    println!(
        "numerics:      {:?} ({} KV cache)",
        c.numerics,
        c.numerics.kv_type().name()
    );
    tokenizer_summary(&lm.tokenizer, vocab_model);
}

/// The tokenizer's kind, size and special tokens.
fn tokenizer_summary(t: &Tokenizer, vocab_model: &str) {
    let name = |id: Option<u32>| {
        id.map(|i| format!("{i} {:?}", t.token_text(i).unwrap_or("?")))
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "tokenizer:     {:?} ({}), {} tokens, pre-tokenizer {}",
        t.kind(),
        vocab_model,
        t.vocab_size(),
        t.pre_tokenizer().unwrap_or("-")
    );
    println!(
        "special:       bos {} | eos {} | add bos {} | end-of-generation {:?}",
        name(t.bos()),
        name(t.eos()),
        t.add_bos(),
        t.eog_ids()
    );
}

/// A Hugging Face folder: config.json, the checkpoint (safetensors or PyTorch), the
/// tokenizer.
fn inspect_hf(dir: &std::path::Path, args: &InspectArgs) -> Result<()> {
    let f = HfFolder::open(dir)?;
    let n_tensors: usize = f.weights.files.iter().map(|s| s.tensors().len()).sum();
    println!("folder:        {}", dir.display());
    println!(
        "format:        Hugging Face, {} ({} file{}, {n_tensors} tensors)",
        f.weights.files.first().map_or("no weights", |w| w.format()),
        f.weights.files.len(),
        if f.weights.files.len() == 1 { "" } else { "s" }
    );
    let size: u64 = f.weights.files.iter().map(|s| s.bytes().len() as u64).sum();
    println!("size:          {}", human_bytes(size));
    println!(
        "architecture:  {}",
        f.architecture().unwrap_or("(none in config.json)")
    );
    match LoadedModel::open_with(dir, LoadOptions::READ_ONLY) {
        Ok(lm) => {
            println!("parameters:    {:.1} M", lm.model.n_params() as f64 / 1e6);
            resolved(&lm, "tokenizer.json");
            for w in lm.tokenizer.warnings() {
                println!("warning:       {w}");
            }
            match lm.template.is_fallback() {
                true => println!("chat template: (none; mica falls back to ChatML)"),
                false => println!("chat template: from tokenizer_config.json"),
            }
        }
        Err(e) => println!("(cannot run this folder: {e})"),
    }
    let mut by_type: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for (_, t) in f.weights.tensors() {
        let e = by_type.entry(t.ggml_type.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    println!("tensors by type:");
    for (ty, (n, bytes)) in &by_type {
        println!("  {ty:<8} {n:>5} tensors  {:>10}", human_bytes(*bytes));
    }
    if args.metadata {
        println!("config.json:\n{:#}", f.config_json);
        if let Some(g) = &f.generation {
            println!("generation_config.json:\n{g:#}");
        }
    }
    if args.tensors {
        println!("tensors:");
        for (_, t) in f.weights.tensors() {
            // Shapes as the checkpoint writes them (outermost first).
            let shape: Vec<u64> = t.shape.iter().rev().copied().collect();
            println!(
                "  {:<48} {:<6} {:?} {}",
                t.name,
                t.ggml_type.name(),
                shape,
                human_bytes(t.n_bytes)
            );
        }
    }
    Ok(())
}
