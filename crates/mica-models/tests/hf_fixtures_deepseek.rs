//! DeepSeek-V2 (fixtures/hf/deepseek2, written by fixtures/hf/make_fixtures.py): latent
//! attention with the query's low-rank projection, YaRN on the rope dimensions, a dense
//! first layer and grouped routed experts plus a shared one. mica's f32 logits at every
//! position within 1e-4 of transformers' and its greedy continuation identical, from the
//! folder and from llama.cpp's conversion (fixtures/converted/deepseek2, ungrouped: llama.cpp
//! ranks groups otherwise). The cache holds the latent: its bytes per token are the pool's
//! own accounting, against what full keys and values would take.

mod hf_common;
use hf_common::*;
use mica_models::config::Numerics;
use mica_models::kv_cache::{BLOCK_SIZE, CacheTypes, KvType};

#[test]
fn deepseek2_matches_transformers() {
    check("deepseek2");
}

#[test]
fn deepseek2_gguf_matches_transformers() {
    let model = check_converted("deepseek2");
    assert!(
        model.layers[1..]
            .iter()
            .all(|l| matches!(l.ffn, mica_models::model::Ffn::Moe(_))),
        "the layers after the first are sparse"
    );
    assert!(matches!(
        model.layers[0].ffn,
        mica_models::model::Ffn::Dense(_)
    ));
}

/// A prefill of 96 tokens in one batch against the same tokens one at a time (the cache's
/// latent rows written and read back across blocks).
#[test]
fn deepseek2_batch_matches_token_by_token() {
    tiled_prefill_matches_token_by_token("deepseek2");
}

/// The pool stores one latent row per token and layer (kv_lora_rank + rope dimensions, half
/// in the key pool, half in the value pool), not per-head keys and values.
#[test]
fn deepseek2_cache_holds_the_latent() {
    let (model, _, _) = load("deepseek2");
    let cfg = &model.config;
    let mla = cfg.mla.as_ref().expect("latent attention");
    assert_eq!(cfg.numerics, Numerics::F32);
    let per_token = KvCache::bytes_per_block(cfg) / BLOCK_SIZE;
    let f32_latent = cfg.n_layer * mla.latent_dim() * 4;
    assert_eq!(per_token, f32_latent);
    let full = cfg.n_layer * mla.full_kv_values(cfg.n_head) * 4;
    // (32 + 16) latent values against 4 heads × (32 key + 24 value) values per layer.
    assert_eq!(
        (mla.latent_dim(), mla.full_kv_values(cfg.n_head)),
        (48, 224)
    );
    println!(
        "deepseek2 fixture: KV bytes per token (f32, {} layers) latent {per_token}, full K/V \
         {full} ({:.1}x)",
        cfg.n_layer,
        full as f64 / per_token as f64
    );
    // A cache of 64 tokens says the same.
    let kv = KvCache::new(cfg, 64, 1);
    assert_eq!(kv.bytes_per_seq(), 64 * f32_latent);
    // f16 halves it; quantized types are refused for the latent.
    let mut c = cfg.clone();
    c.set_cache_types(CacheTypes::both(KvType::F16)).unwrap();
    assert_eq!(KvCache::bytes_per_block(&c) / BLOCK_SIZE, f32_latent / 2);
    let err = c
        .set_cache_types(CacheTypes::both(KvType::Q8_0))
        .unwrap_err()
        .to_string();
    assert!(err.contains("latent"), "{err}");
}

/// The same accounting for DeepSeek-V2-Lite's shape (27 layers, 16 heads, latent 512 + 64,
/// heads of 128 + 64 keys and 128 values), f16 as llama.cpp stores it: 8.9 times less than
/// full keys and values.
#[test]
fn deepseek2_lite_shape_latent_bytes() {
    let (model, _, _) = load("deepseek2");
    let mut cfg = model.config.clone();
    let n = 27;
    let mla = mica_models::config::MlaConfig {
        q_lora_rank: None,
        kv_lora_rank: 512,
        qk_nope: 128,
        qk_rope: 64,
        v_head_dim: 128,
        kq_scale: 1.0,
        rope_mscale: 1.0,
    };
    cfg.n_layer = n;
    cfg.n_head = 16;
    cfg.head_dim = mla.half();
    cfg.layer_head_dim = vec![mla.half(); n];
    cfg.layer_n_head_kv = vec![1; n];
    cfg.layer_kv_from = vec![None; n];
    cfg.numerics = Numerics::LlamaCpp;
    cfg.mla = Some(mla.clone());
    let per_token = KvCache::bytes_per_block(&cfg) / BLOCK_SIZE;
    let full = n * mla.full_kv_values(16) * 2;
    assert_eq!(per_token, n * 576 * 2);
    assert_eq!(full, 276_480);
    println!(
        "DeepSeek-V2-Lite shape: KV bytes per token (f16) latent {per_token}, full K/V {full} \
         ({:.1}x)",
        full as f64 / per_token as f64
    );
}

/// With llama.cpp's numerics (f16 cache) the folder still tracks transformers closely.
#[test]
fn deepseek2_f16_cache_stays_close() {
    let (mut model, exp, want) = load("deepseek2");
    model.config.numerics = Numerics::LlamaCpp;
    let seq = ids(&exp["sequences"][0]);
    let v = model.config.n_vocab;
    let d = max_diff(
        "deepseek2 (f16 cache)",
        &model,
        &seq,
        64,
        &want[..seq.len() * v],
    );
    println!("deepseek2 f16 cache: max |Δlogit| {d:.2e}");
    assert!(d < 2e-2, "{d:.2e}");
}

/// Bad latent-attention and routing fields are refused with the field named.
#[test]
fn deepseek2_config_errors_name_the_field() {
    config_error_names("deepseek2", "kv_lora_rank", |c| {
        c.as_object_mut().unwrap().remove("kv_lora_rank");
    });
    config_error_names("deepseek2", "n_group", |c| c["n_group"] = 3.into());
    config_error_names("deepseek2", "topk_method", |c| {
        c["topk_method"] = "best".into()
    });
    config_error_names("deepseek2", "rope_parameters.rope_type", |c| {
        c["rope_parameters"]["rope_type"] = "dynamic".into()
    });
}

/// What makes the logits match: the fixture's expert groups, its routed scaling and YaRN's
/// mscale² in the softmax scale each move the logits well past the tolerance when dropped.
#[test]
fn deepseek2_groups_scaling_and_mscale_bite() {
    use mica_models::model::Ffn;
    let (model, exp, want) = load("deepseek2");
    let seq = ids(&exp["sequences"][0]);
    let want = &want[..seq.len() * model.config.n_vocab];
    let base = max_diff("deepseek2", &model, &seq, 64, want);
    assert!(base <= MAX_ABS, "{base:.2e}");
    type Edit = fn(&mut Model);
    let edits: [(&str, Edit); 3] = [
        ("ungrouped", |m| {
            for l in &mut m.layers {
                if let Ffn::Moe(moe) = &mut l.ffn {
                    moe.routing.groups = None;
                }
            }
        }),
        ("unscaled", |m| {
            for l in &mut m.layers {
                if let Ffn::Moe(moe) = &mut l.ffn {
                    moe.routing.scale = 1.0;
                }
            }
        }),
        ("no mscale", |m| {
            let c = m.config.mla.as_mut().unwrap();
            c.kq_scale = 1.0 / ((c.qk_nope + c.qk_rope) as f32).sqrt();
        }),
    ];
    for (what, edit) in edits {
        let (mut m, _, _) = load("deepseek2");
        edit(&mut m);
        let d = max_diff("deepseek2", &m, &seq, 64, want);
        println!("deepseek2 {what}: max |Δlogit| {d:.2e}");
        assert!(d > 1e-2, "{what}: {d:.2e}");
    }
}

/// DeepSeek-V3 (fixtures/hf/deepseek3): sigmoid scores chosen with the correction bias
/// from the best two of four groups (ranked by their best two experts), renormalized and
/// scaled; a direct query projection. llama.cpp's conversion keeps the groups (its rule is
/// V3's).
#[test]
fn deepseek3_matches_transformers() {
    check("deepseek3");
}

#[test]
fn deepseek3_gguf_matches_transformers() {
    check_converted_moe("deepseek3");
}

/// The V3 fixture's choice bias and groups are what make the logits match.
#[test]
fn deepseek3_bias_and_groups_bite() {
    use mica_models::model::Ffn;
    let (model, exp, want) = load("deepseek3");
    let seq = ids(&exp["sequences"][0]);
    let want = &want[..seq.len() * model.config.n_vocab];
    assert!(max_diff("deepseek3", &model, &seq, 64, want) <= MAX_ABS);
    for what in ["no bias", "ungrouped"] {
        let (mut m, _, _) = load("deepseek3");
        for l in &mut m.layers {
            if let Ffn::Moe(moe) = &mut l.ffn {
                assert!(moe.routing.choice_bias.is_some());
                match what {
                    "no bias" => moe.routing.choice_bias = None,
                    _ => moe.routing.groups = None,
                }
            }
        }
        let d = max_diff("deepseek3", &m, &seq, 64, want);
        println!("deepseek3 {what}: max |Δlogit| {d:.2e}");
        assert!(d > 1e-2, "{what}: {d:.2e}");
    }
}

#[test]
fn deepseek2_q8_0_matches_llama_cpp() {
    check_llama_cpp_q8("deepseek2");
}

/// Two sequences in one batch, interleaved, with the second one's prompt continued by a
/// token of decoding while the first still prefills: each token's logits are those of its
/// sequence run alone (each reads only its own sequence's latent rows), on the f16 cache.
#[test]
fn deepseek2_ragged_batch_matches_sequences_alone() {
    let (mut model, exp, _) = load("deepseek2");
    model.config.numerics = Numerics::LlamaCpp;
    let pool = ThreadPool::new(2);
    let v = model.config.n_vocab;
    let a = ids(&exp["sequences"][0]);
    let b = ids(&exp["sequences"][1]);
    let alone = |seq: &[u32]| {
        let mut kv = KvCache::new(&model.config, 64, 1);
        let mut ws = Workspace::default();
        model
            .forward(
                &pool,
                &Batch::for_sequence(seq, 0, 0, true),
                &mut kv,
                &mut ws,
            )
            .unwrap()
            .to_vec()
    };
    let (want_a, want_b) = (alone(&a), alone(&b));
    let mut kv = KvCache::new(&model.config, 64, 2);
    let mut ws = Workspace::default();
    // b's first 5 tokens first, then a's whole prompt and the rest of b, interleaved.
    let first = model
        .forward(
            &pool,
            &Batch::for_sequence(&b[..5], 0, 1, true),
            &mut kv,
            &mut ws,
        )
        .unwrap()
        .to_vec();
    let mut batch = Batch::new();
    let mut order = Vec::new();
    for i in 0..a.len().max(b.len() - 5) {
        if i < a.len() {
            batch.push(a[i], i, 0, true);
            order.push((0, i));
        }
        if 5 + i < b.len() {
            batch.push(b[5 + i], 5 + i, 1, true);
            order.push((1, 5 + i));
        }
    }
    let got = model
        .forward(&pool, &batch, &mut kv, &mut ws)
        .unwrap()
        .to_vec();
    let mut worst = 0f32;
    for p in 0..5 {
        for (x, y) in first[p * v..(p + 1) * v].iter().zip(&want_b[p * v..]) {
            worst = worst.max((x - y).abs());
        }
    }
    for (k, &(s, p)) in order.iter().enumerate() {
        let want = if s == 0 { &want_a } else { &want_b };
        for (x, y) in got[k * v..(k + 1) * v].iter().zip(&want[p * v..]) {
            worst = worst.max((x - y).abs());
        }
    }
    assert_eq!(worst, 0.0, "ragged batch vs alone: {worst:.2e}");
}
