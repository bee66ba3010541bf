//! Checks `ops::libm_expf` against this process's libm `expf` on every f32 bit pattern:
//! the scalar model and each SIMD implementation the CPU supports, bit for bit. About a
//! minute per implementation; run it after touching the module or on a new C library:
//! `cargo run --release -p mica-kernels --example expf_exhaustive`.

use mica_kernels::ops::libm_expf::{all, expf_ref};

fn main() {
    const CHUNK: u64 = 1 << 20;
    let mut impls: Vec<_> = all().into_iter().filter(|(_, _, ok)| *ok).collect();
    impls.retain(|(name, _, _)| *name != "scalar");
    let mut bad = 0u64;
    let mut buf = vec![0f32; CHUNK as usize];
    let mut want = vec![0u32; CHUNK as usize];
    let mut start = 0u64;
    while start < 1 << 32 {
        for (i, w) in want.iter_mut().enumerate() {
            let x = f32::from_bits((start + i as u64) as u32);
            let libm = x.exp().to_bits();
            let model = expf_ref(x).to_bits();
            if model != libm && !(x.exp().is_nan() && f32::from_bits(model).is_nan()) {
                if bad < 10 {
                    eprintln!("model: expf({x:e}) = {model:#x}, libm {libm:#x}");
                }
                bad += 1;
            }
            *w = libm;
        }
        for (name, f, _) in &impls {
            for (i, b) in buf.iter_mut().enumerate() {
                *b = f32::from_bits((start + i as u64) as u32);
            }
            f(&mut buf);
            for (i, (g, w)) in buf.iter().zip(&want).enumerate() {
                let nan_both = g.is_nan() && f32::from_bits(*w).is_nan();
                if g.to_bits() != *w && !nan_both {
                    if bad < 10 {
                        let x = f32::from_bits((start + i as u64) as u32);
                        eprintln!("{name}: expf({x:e}) = {:#x}, libm {w:#x}", g.to_bits());
                    }
                    bad += 1;
                }
            }
        }
        start += CHUNK;
    }
    let names: Vec<_> = impls.iter().map(|(n, _, _)| *n).collect();
    println!("scalar model and {names:?}: {bad} of 2^32 arguments differ from libm expf");
    std::process::exit(if bad == 0 { 0 } else { 1 });
}
