//! The current-generation families' fixtures (Gemma 4 dense, with per-layer embeddings and
//! KV sharing, and MoE; Qwen3.5 dense and MoE) against transformers and llama.cpp, as
//! `hf_fixtures.rs` checks the others (shared helpers: `hf_common`).

mod hf_common;
use hf_common::*;

/// The experts of a Gemma 4 MoE layer, with the layer's MLP beside them.
fn gemma4_moe_layers(model: &Model) -> Vec<&mica_models::model::Moe> {
    model
        .layers
        .iter()
        .map(|l| match &l.ffn {
            mica_models::model::Ffn::Moe(m) => m,
            _ => panic!("gemma4_moe: a dense layer"),
        })
        .collect()
}

/// The same for Gemma 4, whose layers differ in head size and key/value heads (the cache
/// holds rows of each layer's own width) and alternate sliding and global attention.
#[test]
fn gemma4_tiled_prefill_matches_token_by_token() {
    tiled_prefill_matches_token_by_token("gemma4");
}

/// And for Gemma 4 MoE: 96 prompt tokens routed as one batch, grouped by expert, give each
/// token what it gets alone.
#[test]
fn gemma4_moe_tiled_prefill_matches_token_by_token() {
    tiled_prefill_matches_token_by_token("gemma4_moe");
}

/// Gemma 4 (dense): sliding layers of 2 KV heads × 16, global layers (2 and 4) of 1 KV head
/// × 32 whose values are their keys (`attention_k_eq_v`), proportional RoPE on the global
/// layers, weightless value norm, random per-layer output scales. Each of these is seen to
/// matter: the same model without the layer scales, or with the global layers' unrotated
/// pairs rotated, is far off.
#[test]
fn gemma4_matches_transformers() {
    check("gemma4");
    let (mut model, exp, want) = load("gemma4");
    let cfg = &model.config;
    assert_eq!(cfg.layer_head_dim, [16, 16, 32, 16, 32]);
    assert_eq!(cfg.layer_n_head_kv, [2, 2, 1, 2, 1]);
    assert_eq!(
        cfg.layer_window,
        [Some(5), Some(5), None, Some(5), None],
        "sliding pattern"
    );
    assert!(model.layers[2].wv.is_none() && model.layers[0].wv.is_some());
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    let scales: Vec<Option<f32>> = model.layers.iter().map(|l| l.out_scale).collect();
    for l in &mut model.layers {
        l.out_scale = None;
    }
    let off = max_diff("gemma4 (no layer scale)", &model, &seq, 64, &want[..n]);
    println!("gemma4 without its layer scales: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "layer scales moved the logits by {off:.2e}"
    );
    for (l, s) in model.layers.iter_mut().zip(scales) {
        l.out_scale = s;
    }
    model.config.rope.freq_factors = None;
    let off = max_diff("gemma4 (full RoPE)", &model, &seq, 64, &want[..n]);
    println!("gemma4 with whole-head RoPE on its global layers: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "proportional RoPE moved the logits by {off:.2e}"
    );
}

/// Gemma 4 through llama.cpp's converter: per-layer `head_count_kv`, `key_length` /
/// `key_length_swa`, the layer pattern, `rope_freqs.weight` and `layer_output_scale.weight`.
#[test]
fn gemma4_gguf_matches_transformers() {
    let model = check_converted("gemma4");
    assert_eq!(model.config.layer_head_dim, [16, 16, 32, 16, 32]);
    assert_eq!(model.config.layer_n_head_kv, [2, 2, 1, 2, 1]);
}

#[test]
fn gemma4_config_errors_name_the_field() {
    // The MoE block switched on without its experts.
    config_error_names("gemma4", "num_experts", |c| {
        c["enable_moe_block"] = true.into();
    });
    // Only layer 0 (sliding) left unshared: the global layers have none to reuse.
    config_error_names("gemma4", "num_kv_shared_layers", |c| {
        c["num_kv_shared_layers"] = 4.into();
    });
    config_error_names("gemma4", "per_layer_config.2.num_key_value_heads", |c| {
        c["per_layer_config"]["2"]["num_key_value_heads"] = 3.into();
    });
}

/// What a Gemma 4 text config may carry that mica does not run is refused at load, the
/// error naming the field and the value: bidirectional attention over text, attention
/// biases, another activation, a per-layer embedding table that disagrees with the config.
#[test]
fn gemma4_unsupported_options_are_refused_naming_field_and_value() {
    let cases: [(&str, &str, &str, Value); 5] = [
        (
            "gemma4",
            "use_bidirectional_attention",
            "\"all\"",
            "all".into(),
        ),
        (
            "gemma4",
            "use_bidirectional_attention",
            "\"both\"",
            "both".into(),
        ),
        ("gemma4", "attention_bias", "true", true.into()),
        ("gemma4", "hidden_activation", "\"silu\"", "silu".into()),
        (
            "gemma4_shared",
            "vocab_size_per_layer_input",
            "64",
            64.into(),
        ),
    ];
    for (family, field, shown, value) in cases {
        let err = config_error_names(family, field, |c| c[field] = value.clone());
        assert!(
            err.contains(shown),
            "{family} {field}: value not named: {err}"
        );
        println!("{field} = {shown}: {err}");
    }
}

/// `use_bidirectional_attention: "vision"` makes only image tokens bidirectional: a text
/// model runs causally, as without it (and as llama.cpp runs it).
#[test]
fn gemma4_vision_bidirectional_attention_leaves_text_causal() {
    let model = load_edited("gemma4", "vision", |c| {
        c["use_bidirectional_attention"] = "vision".into();
    })
    .unwrap();
    let (_, exp, want) = load("gemma4");
    check_model("gemma4 (vision)", &model, &exp, &want);
}

#[test]
fn gemma4_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("gemma4");
}

/// A paged cache for Gemma 4's layers of different widths: a prefix copied block by block
/// (`copy_block`, as the engine's copy-on-write does) into another sequence continues
/// exactly as the original, and a block costs each layer's own width.
#[test]
fn gemma4_paged_cache_copies_blocks_of_every_layer_width() {
    use mica_models::kv_cache::BLOCK_SIZE;
    let (model, _, _) = load("gemma4");
    let cfg = &model.config;
    let width: usize = (0..cfg.n_layer).map(|l| cfg.kv_dim_of(l)).sum();
    assert_eq!(width, 3 * 32 + 2 * 32, "sliding 2×16, global 1×32");
    assert_eq!(KvCache::bytes_per_block(cfg), 2 * BLOCK_SIZE * width * 4);
    let pool = ThreadPool::new(2);
    let mut kv = KvCache::paged(cfg, 8, 2, 64);
    let mut ws = Workspace::default();
    let prompt: Vec<u32> = (0..20u32).map(|i| (i * 29 + 5) % 128).collect();
    kv.set_table(0, &[3, 1], 0).unwrap();
    model
        .forward(
            &pool,
            &Batch::for_sequence(&prompt, 0, 0, false),
            &mut kv,
            &mut ws,
        )
        .unwrap();
    kv.copy_block(3, 5);
    kv.copy_block(1, 0);
    kv.set_table(1, &[5, 0], prompt.len()).unwrap();
    let next = |kv: &mut KvCache, ws: &mut Workspace, seq| {
        let b = Batch::for_sequence(&[7], prompt.len(), seq, true);
        model.forward(&pool, &b, kv, ws).unwrap().to_vec()
    };
    let a = next(&mut kv, &mut ws, 0);
    let b = next(&mut kv, &mut ws, 1);
    assert_eq!(a, b, "the copied prefix continues as the original");
}

/// Gemma 4 as its smallest models are built: per-layer embeddings, and layers 4 and 5
/// computing no keys or values, attending over layers 2 and 3's (stored once), with
/// double-wide feed-forwards. The folder, its llama.cpp conversion, and that quantized to
/// Q8_0 by llama.cpp.
#[test]
fn gemma4_shared_matches_transformers() {
    check("gemma4_shared");
    let (mut model, exp, want) = load("gemma4_shared");
    assert_eq!(model.ple.as_ref().map(|p| p.dim), Some(8));
    let cfg = &model.config;
    assert_eq!(
        cfg.layer_kv_from,
        [None, None, None, None, Some(2), Some(3)]
    );
    assert_eq!(cfg.layer_n_ff, [96, 96, 96, 96, 192, 192]);
    assert!(model.layers[4].wk.is_none() && model.layers[5].wv.is_none());
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    for l in &mut model.layers {
        l.ple = None;
    }
    let off = max_diff("gemma4_shared (no PLE)", &model, &seq, 64, &want[..n]);
    println!("gemma4_shared without its per-layer terms: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "per-layer embeddings moved the logits by {off:.2e}"
    );
    let cfg = &model.config;
    // Shared layers store nothing: two sliding layers of 2×16 and two global of 1×32.
    assert_eq!(
        KvCache::bytes_per_block(cfg),
        2 * mica_models::kv_cache::BLOCK_SIZE * (2 * 32 + 2 * 32) * 4
    );
}

#[test]
fn gemma4_shared_gguf_matches_transformers() {
    let model = check_converted("gemma4_shared");
    assert_eq!(
        model.config.layer_kv_from,
        [None, None, None, None, Some(2), Some(3)]
    );
}

#[test]
fn gemma4_shared_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("gemma4_shared");
}

/// Gemma 4's MoE block: every layer runs its dense MLP (as the shared expert, on the
/// feed-forward norm) beside four GeGLU experts of width 32 read from the stacked
/// `experts.gate_up_proj` (top 2 renormalized, router on its own scaled norm, per-expert
/// output scales), each branch normed before the sum. The router's scale and the per-expert
/// scales are each seen to matter.
#[test]
fn gemma4_moe_matches_transformers() {
    check("gemma4_moe");
    let (mut model, exp, want) = load("gemma4_moe");
    for m in gemma4_moe_layers(&model) {
        assert_eq!((m.experts.len(), m.top_k, m.norm_topk), (4, 2, true));
        assert_eq!(m.experts[0].up.out_dim(), 32);
        assert_eq!(m.shared.as_ref().map(|s| s.up.out_dim()), Some(32));
        assert!(m.norms.is_some() && m.expert_scale.is_some() && m.shared_gate.is_none());
    }
    let seq = ids(&exp["sequences"][0]);
    let n = seq.len() * model.config.n_vocab;
    fn moes(model: &mut Model) -> Vec<&mut mica_models::model::Moe> {
        model
            .layers
            .iter_mut()
            .filter_map(|l| match &mut l.ffn {
                mica_models::model::Ffn::Moe(m) => Some(m),
                _ => None,
            })
            .collect()
    }
    let scales: Vec<_> = moes(&mut model)
        .into_iter()
        .map(|m| m.expert_scale.take())
        .collect();
    let off = max_diff("gemma4_moe (no expert scale)", &model, &seq, 64, &want[..n]);
    println!("gemma4_moe without its per-expert scales: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "per-expert scales moved the logits by {off:.2e}"
    );
    for (m, s) in moes(&mut model).into_iter().zip(scales) {
        m.expert_scale = s;
        let norms = m.norms.as_mut().unwrap();
        norms.router_in.iter_mut().for_each(|v| *v = 1.0);
    }
    let off = max_diff("gemma4_moe (router scale 1)", &model, &seq, 64, &want[..n]);
    println!("gemma4_moe with router scale 1: max |Δlogit| {off:.2e}");
    assert!(
        off > 100.0 * MAX_ABS,
        "the router scale moved the logits by {off:.2e}"
    );
}

/// The MoE model through llama.cpp's converter: `expert_count`, `expert_used_count`,
/// `expert_feed_forward_length`, the fused `ffn_gate_up_exps`, `ffn_gate_inp.scale`,
/// `ffn_down_exps.scale` and the branch norms.
#[test]
fn gemma4_moe_gguf_matches_transformers() {
    let model = check_converted("gemma4_moe");
    assert_eq!(gemma4_moe_layers(&model).len(), 2);
}

#[test]
fn gemma4_moe_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("gemma4_moe");
}

#[test]
fn gemma4_moe_config_errors_name_the_field() {
    config_error_names("gemma4_moe", "top_k_experts", |c| {
        c["top_k_experts"] = 5.into();
    });
    config_error_names("gemma4_moe", "moe_intermediate_size", |c| {
        c.as_object_mut().unwrap().remove("moe_intermediate_size");
    });
}

/// llama.cpp's `convert_hf_to_gguf.py --fuse-qkv` stores q, k and v of every layer that has
/// all three as one `attn_qkv` (rows q | k | v): Gemma 4 MoE's sliding layer, while its
/// global layer (values from the keys) keeps `attn_q` and `attn_k`. That file, made here from
/// the converted fixture by concatenating the rows (the converter's own `--fuse-qkv` output
/// for this folder has the same bytes), gives the unfused file's logits bit for bit.
#[test]
fn gemma4_fused_qkv_gguf_gives_the_same_logits() {
    use mica_formats::{GgufFile, GgufWriter};
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/converted/gemma4_moe");
    let src = GgufFile::open(d.join("model.f32.gguf")).unwrap();
    let prefix = |n: &str| n.rsplit_once("attn_").map(|(p, _)| p.to_string());
    let has_v = |p: &str| src.tensor(&format!("{p}attn_v.weight")).is_some();
    let mut fused = Vec::new();
    for t in src.tensors() {
        if let Some(p) = prefix(&t.name).filter(|p| has_v(p))
            && t.name == format!("{p}attn_q.weight")
        {
            let parts =
                ["q", "k", "v"].map(|x| src.tensor(&format!("{p}attn_{x}.weight")).unwrap());
            let bytes: Vec<u8> = parts
                .iter()
                .flat_map(|t| src.tensor_data(t).to_vec())
                .collect();
            let rows: u64 = parts.iter().map(|t| t.shape[1]).sum();
            fused.push((format!("{p}attn_qkv.weight"), t.shape[0], rows, bytes));
        }
    }
    assert_eq!(fused.len(), 1, "the sliding layer only");
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata_entries() {
        w.meta(k, v.clone());
    }
    for t in src.tensors() {
        let fused_away = ["attn_q.weight", "attn_k.weight", "attn_v.weight"]
            .iter()
            .any(|s| t.name.ends_with(s))
            && prefix(&t.name).is_some_and(|p| has_v(&p));
        if !fused_away {
            w.tensor(&t.name, t.ggml_type, &t.shape, src.tensor_data(t));
        }
    }
    for (name, cols, rows, bytes) in &fused {
        w.tensor(name, src.tensors()[0].ggml_type, &[*cols, *rows], bytes);
    }
    let path = std::env::temp_dir().join(format!("mica-fused-qkv-{}.gguf", std::process::id()));
    std::fs::write(&path, w.to_bytes()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert!(
        file.tensor("blk.0.attn_qkv.weight").is_some()
            && file.tensor("blk.0.attn_q.weight").is_none()
    );
    let model = mica_models::arch::load_gguf(std::sync::Arc::new(file)).unwrap();
    std::fs::remove_file(&path).unwrap();
    let plain = mica_models::arch::load_gguf(std::sync::Arc::new(src)).unwrap();
    let seq = [1u32, 17, 33, 5, 98, 64, 12, 77, 3, 120];
    let run = |m: &Model| {
        let pool = ThreadPool::new(2);
        let mut kv = KvCache::new(&m.config, 64, 1);
        let mut ws = Workspace::default();
        let b = Batch::for_sequence(&seq, 0, 0, true);
        m.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec()
    };
    assert_eq!(run(&model), run(&plain), "fused and separate q, k, v");
}

/// Qwen3.5: three Gated DeltaNet layers (2 key heads, 4 grouped value heads) and one gated
/// attention layer.
#[test]
fn qwen35_matches_transformers() {
    check("qwen35");
}

/// Qwen3.5 through llama.cpp's converter (value heads reordered to tiled, `A_log` as
/// `-exp(A_log)`, norms with the 1 folded in).
#[test]
fn qwen35_gguf_matches_transformers() {
    let model = check_converted("qwen35");
    let d = model.config.delta_net.as_ref().unwrap();
    assert_eq!(d.layers, [true, true, true, false]);
    assert!(d.v_tiled);
}

#[test]
fn qwen35_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen35");
}

/// Qwen3.5-MoE: the Qwen3.5 layers with 4 experts (top-2, renormalized) and a gated shared
/// expert in every layer.
#[test]
fn qwen35moe_matches_transformers() {
    check("qwen35moe");
}

#[test]
fn qwen35moe_gguf_matches_transformers() {
    check_converted_moe("qwen35moe");
}

#[test]
fn qwen35moe_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen35moe");
}

/// The published Gemma 4 checkpoints are `Gemma4ForConditionalGeneration` folders: the text
/// model's config under `text_config`, its weights under `model.language_model.`, vision and
/// audio towers beside it (transformers 5.23's layout). The gemma4_shared fixture rewritten
/// so, with a vision tensor added, gives the plain folder's logits bit for bit; `mica convert`
/// refuses it naming the class.
#[test]
fn gemma4_for_conditional_generation_runs_its_text_model() {
    let src = dir("gemma4_shared");
    let tmp = std::env::temp_dir().join(format!("mica-gemma4-wrapped-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let mut text: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    text.as_object_mut().unwrap().remove("architectures");
    let cfg = serde_json::json!({
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 2},
        "audio_config": null,
        "tie_word_embeddings": true,
    });
    std::fs::write(tmp.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(
        src.join("generation_config.json"),
        tmp.join("generation_config.json"),
    )
    .unwrap();
    // The checkpoint's tensors renamed, and one of a vision tower.
    let st = mica_formats::SafetensorsFile::open(src.join("model.safetensors")).unwrap();
    let vision = [0u8; 16];
    let mut entries: Vec<(String, Vec<u64>, &[u8])> = st
        .tensors()
        .iter()
        .map(|t| {
            let name = t.name.replacen("model.", "model.language_model.", 1);
            (
                name,
                t.shape.iter().rev().copied().collect(),
                st.tensor_data(t),
            )
        })
        .collect();
    entries.push((
        "model.vision_tower.patch_embedder.input_proj.weight".into(),
        vec![2, 2],
        &vision,
    ));
    let (mut header, mut offset) = (serde_json::Map::new(), 0usize);
    for (name, shape, data) in &entries {
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + data.len()]}),
        );
        offset += data.len();
    }
    let header = Value::Object(header).to_string();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    for (_, _, data) in &entries {
        file.extend_from_slice(data);
    }
    std::fs::write(tmp.join("model.safetensors"), file).unwrap();

    let folder = HfFolder::open(&tmp).unwrap();
    let wrapped = mica_models::arch::load_hf(&folder).unwrap();
    let refused = mica_models::arch::to_gguf::GgufLayout::from_hf(&folder)
        .err()
        .expect("mica convert refuses the wrapper")
        .to_string();
    std::fs::remove_dir_all(&tmp).unwrap();
    assert!(
        refused.contains("Gemma4ForConditionalGeneration"),
        "{refused}"
    );
    assert_eq!(wrapped.ple.as_ref().map(|p| p.dim), Some(8));
    let (plain, exp, _) = load("gemma4_shared");
    let seq = ids(&exp["sequences"][0]);
    let run = |m: &Model| {
        let pool = ThreadPool::new(2);
        let mut kv = KvCache::new(&m.config, 64, 1);
        let mut ws = Workspace::default();
        let b = Batch::for_sequence(&seq, 0, 0, true);
        m.forward(&pool, &b, &mut kv, &mut ws).unwrap().to_vec()
    };
    assert_eq!(run(&wrapped), run(&plain), "the wrapped text model");
}

/// Qwen3.5 with DeltaNet heads of 128 (as published), against llama.cpp only: ggml's vector
/// kernels take their SIMD paths there (the tiny fixture's heads of 16 only their scalar
/// tails), and mica's DeltaNet arithmetic follows them.
#[test]
fn qwen35_wide_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("qwen35_wide");
}
