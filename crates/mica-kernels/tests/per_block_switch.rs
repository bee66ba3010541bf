//! The switch to mica's `PerBlock` prompt path of the legacy formats
//! (`simd::set_llama_exact`), through `matmul` as the models call it: off by default (every
//! output llama.cpp's `vec_dot`), on for batches of `PER_BLOCK_MIN_TOKENS` or more where the
//! table has the path's kernel. Its own test binary: the switch is process-wide.

mod quant_common;

use mica_kernels::DType;
use mica_kernels::ThreadPool;
use mica_kernels::matmul::{QActs, QMatrix, matmul};
use mica_kernels::simd::{
    DotPath, PER_BLOCK_MIN_TOKENS, is_legacy, kernels, llama_exact, set_llama_exact,
};
use quant_common::*;

#[test]
fn per_block_is_opt_in_and_taken_by_prompt_batches() {
    let mut r = rng(36);
    let pool = ThreadPool::new(2);
    let k = kernels();
    assert!(llama_exact(), "llama.cpp's arithmetic is the default");
    for t in DType::WEIGHT_TYPES.into_iter().filter(|&t| is_legacy(t)) {
        let (rows, nblocks) = (37, 9);
        let n = nblocks * 32;
        let mut w = Vec::new();
        for _ in 0..rows {
            w.extend(weight_row(t, nblocks, WeightKind::Quantized, &mut r));
        }
        let vt = t.vec_dot_type();
        let rb = t.row_bytes(n).unwrap();
        for toks in [PER_BLOCK_MIN_TOKENS - 1, PER_BLOCK_MIN_TOKENS, 70] {
            let mut xq = Vec::new();
            for _ in 0..toks {
                let x = activations(n, ActKind::Normal, &mut r);
                let mut q = vec![0u8; vt.row_bytes(n).unwrap()];
                k.quantize_act(vt, &x, &mut q);
                xq.extend(q);
            }
            let acts = QActs::from_quantized(vt, n, toks, &xq);
            let packed = k.pack(t, n, rows, &w);
            let m = QMatrix {
                dtype: t,
                rows,
                cols: n,
                data: &w,
                extra_paths: true,
                packed: packed.as_deref(),
            };
            for exact in [true, false] {
                set_llama_exact(exact);
                let mut out = vec![0f32; toks * rows];
                matmul(&pool, &m, &acts, &mut out);
                let per_block =
                    !exact && toks >= PER_BLOCK_MIN_TOKENS && k.has_matmul(DotPath::PerBlock, t);
                let path = if per_block {
                    DotPath::PerBlock
                } else {
                    DotPath::VecDot
                };
                let dot = k.dot_fn(path, t);
                for tok in 0..toks {
                    for row in 0..rows {
                        let want = dot(n, &w[row * rb..(row + 1) * rb], acts.row(tok));
                        let got = out[tok * rows + row];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{t} exact={exact} tokens={toks} out[{tok}, {row}]: {path:?}"
                        );
                    }
                }
            }
            set_llama_exact(true);
        }
        println!(
            "{} {t}: PerBlock {}",
            k.isa(),
            if k.has_matmul(DotPath::PerBlock, t) {
                "taken from 16 tokens when switched on"
            } else {
                "not in this table: VecDot throughout"
            }
        );
    }
}
