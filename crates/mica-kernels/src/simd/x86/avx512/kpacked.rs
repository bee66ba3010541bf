//! The AVX-512 tier's packed layout of Q4_K: sixteen rows interleaved super-block by
//! super-block, so that a decode step (`kmat.rs`' 16-row micro-kernel, one token) reads its
//! weights as one sequential stream instead of sixteen separate rows. The blocks keep the
//! file's bytes and `kmat.rs` reads them with the same code (only the step from one block of
//! a row to its next changes), so products are bit-identical to the file's layout on every
//! path.
//!
//! Group g, step b: block b of rows 16g, 16g+1, …, 16g+15 (the last group repeats the last
//! row), `16 · BYTES` bytes.

use crate::quant::blocks::QK_K;

/// Rows per packed group (the rows of `kmat.rs`' decode micro-kernel).
pub(super) const GROUP: usize = 16;

/// Packs `rows` rows of `n` elements (`data`, the file's layout, `BYTES` per super-block)
/// into groups of [`GROUP`].
pub(super) fn pack<const BYTES: usize>(n: usize, rows: usize, data: &[u8]) -> Vec<u8> {
    let nb = n / QK_K;
    let rb = nb * BYTES;
    assert!(nb * QK_K == n && rows > 0 && data.len() >= rows * rb);
    let gb = GROUP * BYTES;
    let mut out = vec![0u8; rows.div_ceil(GROUP) * nb * gb];
    for (g, group) in out.chunks_exact_mut(nb * gb).enumerate() {
        for (b, o) in group.chunks_exact_mut(gb).enumerate() {
            for (i, o) in o.chunks_exact_mut(BYTES).enumerate() {
                let r = (GROUP * g + i).min(rows - 1);
                o.copy_from_slice(&data[r * rb + b * BYTES..][..BYTES]);
            }
        }
    }
    out
}

/// The inverse of [`pack`] for one row: blocks `blocks` of row `r` in the file's layout.
pub(super) fn unpack<const BYTES: usize>(
    n: usize,
    data: &[u8],
    r: usize,
    blocks: std::ops::Range<usize>,
    out: &mut [u8],
) {
    let nb = n / QK_K;
    let gb = GROUP * BYTES;
    let (g, i) = (r / GROUP, r % GROUP);
    let group = &data[g * nb * gb..][..nb * gb];
    let src = group[blocks.start * gb..blocks.end * gb].chunks_exact(gb);
    for (o, s) in out.chunks_exact_mut(BYTES).zip(src) {
        o.copy_from_slice(&s[i * BYTES..(i + 1) * BYTES]);
    }
}
