//! Writing the planned tensors: raw bytes when a tensor keeps its type, else chunks of rows
//! converted through f32 on every thread (importance-weighted when the matrix has an entry
//! for the tensor), or the whole tensor at once through [`gptq`] when it has calibration
//! Gram matrices.

use super::{CHUNK_ELEMS, Planned, gptq, is_quantized};
use crate::error::{QuantError, Result};
use crate::imatrix::Imatrix;
use crate::progress::{Event, Notice};
use mica_formats::TensorSink;
use mica_kernels::DType;
use mica_kernels::quant::weighted::{has_weighted, quantize_row_weighted};
use mica_kernels::quant::{dequantize_row, quantize_row};
use mica_models::weights::ActStats;

/// What every tensor is written with.
pub(super) struct Writer<'a> {
    pub src: &'a super::Source,
    pub imatrix: Option<&'a Imatrix>,
    pub grams: Option<&'a ActStats>,
    pub threads: usize,
}

impl Writer<'_> {
    /// Streams every planned tensor into `sink`, reporting [`Event::Item`] per tensor and
    /// [`Event::Advance`] per bytes written. Returns how many tensors GPTQ quantized.
    pub fn write_all(
        &self,
        planned: &[Planned],
        sink: &mut dyn TensorSink,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<usize> {
        let mut n_gptq = 0usize;
        let mut factors = gptq::FactorCache::default();
        for p in planned {
            on_event(Event::Item(p.info.name.clone()));
            sink.begin_tensor(&p.info.name, p.target, &p.info.shape)?;
            let imp = self.imatrix.and_then(|m| m.weights(&p.info.name));
            let imp = imp.filter(|w| {
                let ok = w.len() as u64 == p.info.row_len();
                if !ok {
                    on_event(Event::Notice(Notice::ImatrixColumns {
                        tensor: p.info.name.clone(),
                        columns: w.len(),
                        row_len: p.info.row_len(),
                    }));
                }
                ok
            });
            let gram = self.grams.and_then(|g| g.gram(&p.info.name));
            let mut on_bytes = |n| on_event(Event::Advance(n));
            match gram.filter(|_| gptq_applies(p)) {
                Some((g, n)) => {
                    let f = factors
                        .factor(g, n, p.info.row_len() as usize)
                        .map_err(|cause| QuantError::Gptq {
                            tensor: p.info.name.clone(),
                            cause,
                        })?;
                    self.write_tensor_gptq(p, &f, sink, &mut on_bytes)?;
                    n_gptq += 1;
                }
                None => self.write_tensor(p, imp.as_deref(), sink, &mut on_bytes)?,
            }
            sink.end_tensor()?;
        }
        Ok(n_gptq)
    }

    /// Streams one tensor into the sink: raw bytes when the type is unchanged, else chunks of
    /// rows converted through f32.
    fn write_tensor(
        &self,
        p: &Planned,
        imp: Option<&[f32]>,
        sink: &mut dyn TensorSink,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let data = self.src.data(p.idx)?;
        let data: &[u8] = &data;
        if p.target == p.info.ggml_type {
            for chunk in data.chunks(8 << 20) {
                sink.write_data(chunk)?;
                on_bytes(chunk.len() as u64);
            }
            return Ok(());
        }
        let (from, to, in_row, out_row) = row_types(p)?;
        let row_len = p.info.row_len() as usize;
        let n_rows = p.info.n_rows() as usize;
        let rows_per_chunk = (CHUNK_ELEMS / row_len.max(1)).max(1);
        let mut out = vec![0u8; rows_per_chunk.min(n_rows) * out_row];
        for r0 in (0..n_rows).step_by(rows_per_chunk) {
            let nr = rows_per_chunk.min(n_rows - r0);
            let src_bytes = &data[r0 * in_row..(r0 + nr) * in_row];
            let dst = &mut out[..nr * out_row];
            convert_rows(
                from,
                to,
                row_len,
                (in_row, out_row),
                src_bytes,
                dst,
                imp,
                self.threads,
            );
            sink.write_data(dst)?;
            on_bytes(dst.len() as u64);
        }
        Ok(())
    }

    /// [`Writer::write_tensor`] with error compensation: the whole tensor in f32 (`rows × cols`
    /// floats), quantized by [`gptq::quantize`] with the factor of its calibration inputs'
    /// Gram matrix.
    fn write_tensor_gptq(
        &self,
        p: &Planned,
        factor: &gptq::Factor,
        sink: &mut dyn TensorSink,
        on_bytes: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let (from, to, _, _) = row_types(p)?;
        let data = self.src.data(p.idx)?;
        let rows = p.info.n_rows() as usize;
        let out =
            gptq::requantize(from, &data, rows, factor, to, self.threads).map_err(|cause| {
                QuantError::Gptq {
                    tensor: p.info.name.clone(),
                    cause,
                }
            })?;
        sink.write_data(&out)?;
        on_bytes(out.len() as u64);
        Ok(())
    }
}

/// The source and target types of `p` and their row sizes in bytes.
fn row_types(p: &Planned) -> Result<(DType, DType, usize, usize)> {
    let tensor = || p.info.name.clone();
    let from = p
        .info
        .dtype()
        .ok_or_else(|| QuantError::UnreadableType { tensor: tensor() })?;
    let to = p
        .target
        .dtype()
        .ok_or_else(|| QuantError::UnwritableType { tensor: tensor() })?;
    let row_len = p.info.row_len() as usize;
    let (Some(in_row), Some(out_row)) = (from.row_bytes(row_len), to.row_bytes(row_len)) else {
        return Err(QuantError::RowLength {
            tensor: tensor(),
            row_len,
            from,
            to,
        });
    };
    Ok((from, to, in_row, out_row))
}

/// Whether GPTQ can quantize `p`: a quantized target whose blocks divide the rows.
fn gptq_applies(p: &Planned) -> bool {
    let cols = p.info.row_len() as usize;
    p.target != p.info.ggml_type
        && is_quantized(p.target)
        && p.target
            .dtype()
            .is_some_and(|t| cols.is_multiple_of(t.block_size()))
}

/// Converts whole rows `src` (type `from`, `in_row` bytes each) into `dst` (type `to`,
/// `out_row` bytes each) on `threads` threads.
fn convert_rows(
    from: DType,
    to: DType,
    row_len: usize,
    (in_row, out_row): (usize, usize),
    src: &[u8],
    dst: &mut [u8],
    imp: Option<&[f32]>,
    threads: usize,
) {
    let imp = imp.filter(|_| has_weighted(to));
    let n_rows = dst.len() / out_row;
    let per = n_rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (i, d) in dst.chunks_mut(per * out_row).enumerate() {
            let sr = &src[i * per * in_row..];
            s.spawn(move || {
                let mut f = vec![0f32; row_len];
                for (j, drow) in d.chunks_mut(out_row).enumerate() {
                    dequantize_row(from, &sr[j * in_row..(j + 1) * in_row], &mut f);
                    match imp {
                        Some(w) => quantize_row_weighted(to, &f, w, drow),
                        None => quantize_row(to, &f, drow),
                    }
                }
            });
        }
    });
}
