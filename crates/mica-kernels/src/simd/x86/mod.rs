//! The x86-64 tiers, each chosen at run time by feature detection: `avx2` (AVX2 + FMA +
//! F16C) extends the scalar table, `avx512` (AVX-512 F/BW/VL + VNNI) extends the AVX2 one and
//! reuses its low-level helpers.

pub(super) mod avx2;
pub(super) mod avx512;
