//! The aarch64 tiers: `neon` (part of the aarch64 baseline, so always available there).

pub(super) mod neon;
