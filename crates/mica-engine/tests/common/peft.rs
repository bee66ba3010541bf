//! A random PEFT LoRA adapter written for a model's shapes (`adapter_config.json` +
//! `adapter_model.safetensors`), for tests that need an adapter on the test models.
#![allow(dead_code)]

use std::path::Path;

/// Writes a rank-`r` adapter on every layer's `q_proj` and `v_proj` (PEFT names, f32,
/// `lora_alpha` = 2r) for a model of `n_layer` layers of width `n_embd` and key/value width
/// `kv_dim`; `seed` picks the values.
pub fn write_random_peft(dir: &Path, n_layer: usize, n_embd: usize, kv_dim: usize, seed: u64) {
    let r = 4usize;
    std::fs::create_dir_all(dir).unwrap();
    let cfg = format!(
        r#"{{"peft_type": "LORA", "r": {r}, "lora_alpha": {}, "target_modules": ["q_proj", "v_proj"], "bias": "none"}}"#,
        2 * r
    );
    std::fs::write(dir.join("adapter_config.json"), cfg).unwrap();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut uniform = |amp: f32| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * amp
    };
    let mut header = Vec::new();
    let mut data: Vec<u8> = Vec::new();
    for l in 0..n_layer {
        for (proj, out) in [("q_proj", n_embd), ("v_proj", kv_dim)] {
            let m = format!("base_model.model.model.layers.{l}.self_attn.{proj}");
            for (name, shape, amp) in [
                (format!("{m}.lora_A.weight"), [r, n_embd], 0.1),
                (format!("{m}.lora_B.weight"), [out, r], 0.2),
            ] {
                let start = data.len();
                for _ in 0..shape[0] * shape[1] {
                    data.extend_from_slice(&uniform(amp).to_le_bytes());
                }
                header.push(format!(
                    r#""{name}": {{"dtype": "F32", "shape": [{}, {}], "data_offsets": [{start}, {}]}}"#,
                    shape[0],
                    shape[1],
                    data.len()
                ));
            }
        }
    }
    let header = format!("{{{}}}", header.join(", "));
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend_from_slice(header.as_bytes());
    file.extend_from_slice(&data);
    std::fs::write(dir.join("adapter_model.safetensors"), file).unwrap();
}
