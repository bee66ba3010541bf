//! The typed operations: each checks its buffers' extents and shapes on the host (a kernel
//! reading past a buffer would fail silently or corrupt memory), builds the kernel's
//! parameter struct and launch shape, and runs it on any [`Runner`].

use crate::kernels::format_name;
use crate::params::{
    AttnP, AxpyP, BiasP, CopyP, GluP, KvWriteP, MatvecP, NormP, Params, RopeP, RowsP, ScaleP,
};
use crate::runner::{DeviceBuf, Launch, Runner, upload_i32};
use crate::{GpuError, Result};
use mica_kernels::DType;

/// Tokens per `matvec_*` launch (`MV_MAXN` in `kernels/matvec.cu`).
pub const MATVEC_TOKENS: usize = 8;
/// Rows per `matvec_*` block: one warp each (`blockDim.x / 32`).
const MATVEC_ROWS_PER_BLOCK: u32 = 4;
/// `ATT_THREADS` and `ATT_MAXD` (`kernels/attention.cu`).
const ATT_THREADS: u32 = 128;
const ATT_MAX_HEAD_DIM: usize = 256;

fn shape(msg: String) -> GpuError {
    GpuError::Shape(msg)
}

/// Fails unless `buf` holds at least `floats` f32 values.
fn need<B: DeviceBuf>(buf: &B, floats: usize, what: &str) -> Result<()> {
    if buf.len() < floats * 4 {
        return Err(shape(format!(
            "{what}: the buffer holds {} bytes, {} are needed",
            buf.len(),
            floats * 4
        )));
    }
    Ok(())
}

fn int(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| shape(format!("{what} = {v} is too large for the kernels")))
}

fn grid(blocks: usize) -> Result<u32> {
    u32::try_from(blocks.max(1)).map_err(|_| shape(format!("{blocks} blocks")))
}

/// A weight matrix on the device, its rows in the file's block format.
pub struct DeviceMatrix<B> {
    pub buf: B,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

impl<B> std::fmt::Debug for DeviceMatrix<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceMatrix({} × {} {})",
            self.rows,
            self.cols,
            self.dtype.name()
        )
    }
}

impl<B: DeviceBuf> DeviceMatrix<B> {
    /// Uploads `rows × cols` weights stored as `dtype` (`data`: the rows' bytes as in GGUF).
    pub fn upload<R: Runner<Buf = B>>(
        r: &R,
        dtype: DType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<Self> {
        format_name(dtype).ok_or(GpuError::Unsupported(dtype))?;
        let row_bytes = dtype
            .row_bytes(cols)
            .filter(|_| cols.is_multiple_of(dtype.block_size().max(32)))
            .ok_or_else(|| {
                shape(format!(
                    "a {} row of {cols} values is not a whole number of 32-value blocks",
                    dtype.name()
                ))
            })?;
        if data.len() != rows * row_bytes {
            return Err(shape(format!(
                "{rows} × {cols} {} weights take {} bytes, not {}",
                dtype.name(),
                rows * row_bytes,
                data.len()
            )));
        }
        int(rows, "rows")?;
        int(row_bytes, "row bytes")?;
        Ok(DeviceMatrix {
            buf: r.upload(data)?,
            dtype,
            rows,
            cols,
        })
    }

    fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols).expect("checked at upload")
    }
}

/// `y[t][r] = w[r] · x[t]` for `n` tokens: `x` is `[n × cols]`, `y` `[n × rows]` f32.
pub fn matvec<R: Runner>(
    r: &R,
    w: &DeviceMatrix<R::Buf>,
    x: &R::Buf,
    n: usize,
    y: &R::Buf,
) -> Result<()> {
    need(x, n * w.cols, "matvec input")?;
    need(y, n * w.rows, "matvec output")?;
    let name = format!(
        "matvec_{}",
        format_name(w.dtype).expect("checked at upload")
    );
    let dims = Launch {
        grid: grid(w.rows.div_ceil(MATVEC_ROWS_PER_BLOCK as usize))?,
        block: MATVEC_ROWS_PER_BLOCK * 32,
    };
    for t0 in (0..n).step_by(MATVEC_TOKENS) {
        let nt = (n - t0).min(MATVEC_TOKENS);
        let p = MatvecP {
            w: w.buf.addr(),
            x: x.addr() + (t0 * w.cols * 4) as u64,
            y: y.addr() + (t0 * w.rows * 4) as u64,
            rows: int(w.rows, "rows")?,
            cols: int(w.cols, "cols")?,
            n: nt as i32,
            row_bytes: int(w.row_bytes(), "row bytes")?,
            x_stride: int(w.cols, "cols")?,
            y_stride: int(w.rows, "rows")?,
        };
        r.launch(&name, dims, p.bytes())?;
    }
    Ok(())
}

/// `y[t] = w[ids[t]]`, dequantized: `y` is `[ids.len() × cols]` f32.
pub fn get_rows<R: Runner>(r: &R, w: &DeviceMatrix<R::Buf>, ids: &[u32], y: &R::Buf) -> Result<()> {
    if let Some(&bad) = ids.iter().find(|&&i| i as usize >= w.rows) {
        return Err(shape(format!("row {bad} of a {}-row matrix", w.rows)));
    }
    if ids.is_empty() {
        return Ok(());
    }
    need(y, ids.len() * w.cols, "get_rows output")?;
    let idv: Vec<i32> = ids.iter().map(|&i| i as i32).collect();
    let ids_buf = upload_i32(r, &idv)?;
    let p = RowsP {
        w: w.buf.addr(),
        ids: ids_buf.addr(),
        y: y.addr(),
        n: int(ids.len(), "rows")?,
        cols: int(w.cols, "cols")?,
        row_bytes: int(w.row_bytes(), "row bytes")?,
        _pad: 0,
    };
    let name = format!(
        "get_rows_{}",
        format_name(w.dtype).expect("checked at upload")
    );
    r.launch(
        &name,
        Launch {
            grid: grid(ids.len())?,
            block: 128,
        },
        p.bytes(),
    )
}

/// `y[r] = x[r] / sqrt(mean(x[r]²) + eps) ⊙ w` for `rows` rows of `cols` (no `w`: unweighted).
pub fn rms_norm<R: Runner>(
    r: &R,
    x: &R::Buf,
    w: Option<&R::Buf>,
    y: &R::Buf,
    rows: usize,
    cols: usize,
    eps: f32,
) -> Result<()> {
    need(x, rows * cols, "rms_norm input")?;
    need(y, rows * cols, "rms_norm output")?;
    if let Some(w) = w {
        need(w, cols, "rms_norm weight")?;
    }
    if rows == 0 {
        return Ok(());
    }
    let p = NormP {
        x: x.addr(),
        w: w.map_or(0, DeviceBuf::addr),
        y: y.addr(),
        rows: int(rows, "rows")?,
        cols: int(cols, "cols")?,
        eps,
        _pad: 0,
    };
    r.launch(
        "rms_norm",
        Launch {
            grid: grid(rows)?,
            block: 256,
        },
        p.bytes(),
    )
}

/// Positions of a pool's blocks: `BLOCK_SIZE` (the host KV cache's).
pub const BLOCK_SIZE: usize = mica_models::kv_cache::BLOCK_SIZE;
const BLOCK_SHIFT: u32 = BLOCK_SIZE.trailing_zeros();

/// Positions as the kernels take them.
fn positions(pos: &[u32]) -> Result<Vec<i32>> {
    pos.iter().map(|&x| int(x as usize, "position")).collect()
}

/// A step's tokens on the device: each one's position and, for the cache ops, its
/// sequence's block table in the paged KV cache (the host cache's tables: position `p` of a
/// sequence lives in row `table[p / BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE` of every
/// layer's pool). Checked on the host and uploaded once for every op of the step.
pub struct Tokens<B> {
    pub n: usize,
    pos: B,
    /// `[n]` where each token's table starts in `blocks`.
    tbl: B,
    /// The tables of the step's sequences, one after another.
    blocks: B,
    /// The largest block id the tables name; `None`: no tables (positions only).
    max_block: Option<u32>,
}

impl<B: DeviceBuf> Tokens<B> {
    /// Token `t` at position `pos[t]` of sequence `seq[t]`, whose block table is
    /// `tables[seq[t]]`; every position must fall inside its table's blocks.
    pub fn new<R: Runner<Buf = B>>(
        r: &R,
        pos: &[u32],
        seq: &[u32],
        tables: &[&[u32]],
    ) -> Result<Self> {
        if pos.len() != seq.len() {
            return Err(shape(format!(
                "{} positions for {} sequence ids",
                pos.len(),
                seq.len()
            )));
        }
        // Each sequence's table once, in order of first use.
        let mut start: Vec<Option<usize>> = vec![None; tables.len()];
        let (mut blocks, mut tbl) = (Vec::new(), Vec::with_capacity(pos.len()));
        for (t, (&p, &s)) in pos.iter().zip(seq).enumerate() {
            let table = *tables.get(s as usize).ok_or_else(|| {
                shape(format!(
                    "token {t} is of sequence {s}, but {} block tables were given",
                    tables.len()
                ))
            })?;
            if p as usize >= table.len() * BLOCK_SIZE {
                return Err(shape(format!(
                    "token {t} is at position {p}, past the {} positions of sequence {s}'s blocks",
                    table.len() * BLOCK_SIZE
                )));
            }
            let at = match start[s as usize] {
                Some(at) => at,
                None => {
                    let at = blocks.len();
                    for &b in table {
                        blocks.push(int(b as usize, "block id")?);
                    }
                    start[s as usize] = Some(at);
                    at
                }
            };
            tbl.push(int(at, "block table offset")?);
        }
        Ok(Tokens {
            n: pos.len(),
            pos: upload_i32(r, &positions(pos)?)?,
            tbl: upload_i32(r, &tbl)?,
            max_block: Some(blocks.iter().copied().max().unwrap_or(0) as u32),
            blocks: upload_i32(r, &blocks)?,
        })
    }

    /// Positions only, for the ops that read no cache (RoPE).
    pub fn positions<R: Runner<Buf = B>>(r: &R, pos: &[u32]) -> Result<Self> {
        Ok(Tokens {
            n: pos.len(),
            pos: upload_i32(r, &positions(pos)?)?,
            tbl: upload_i32(r, &[])?,
            blocks: upload_i32(r, &[])?,
            max_block: None,
        })
    }
}

/// A rotary embedding's shape and frequencies (see `kernels/elementwise.cu`'s `rope`).
pub struct Rope<'a, B> {
    pub n_head: usize,
    pub head_dim: usize,
    /// Rotated values per head (even, at most `head_dim`).
    pub n_rot: usize,
    /// Values from one token's row to the next.
    pub tok_stride: usize,
    /// Halves `(i, i + n_rot/2)` instead of adjacent pairs.
    pub neox: bool,
    pub theta_base: f32,
    pub freq_scale: f32,
    /// Multiplies cosine and sine (YaRN's attention factor; 1 otherwise).
    pub attn_factor: f32,
    /// `[n_rot / 2]` per-pair frequency divisors.
    pub factors: Option<&'a B>,
}

/// Rotates the first `n_rot` values of each head of every token's row of `x`
/// (`[n × tok_stride]`, heads `head_dim` apart) by its position.
pub fn rope<R: Runner>(
    r: &R,
    x: &R::Buf,
    toks: &Tokens<R::Buf>,
    a: &Rope<'_, R::Buf>,
) -> Result<()> {
    if a.n_rot > a.head_dim || a.n_rot % 2 != 0 || a.n_head * a.head_dim > a.tok_stride {
        return Err(shape(format!(
            "rope of {} of {} values × {} heads in rows of {}",
            a.n_rot, a.head_dim, a.n_head, a.tok_stride
        )));
    }
    need(x, toks.n * a.tok_stride, "rope input")?;
    if let Some(f) = a.factors {
        need(f, a.n_rot / 2, "rope frequency factors")?;
    }
    if toks.n == 0 || a.n_head == 0 {
        return Ok(());
    }
    let p = RopeP {
        x: x.addr(),
        pos: toks.pos.addr(),
        factors: a.factors.map_or(0, DeviceBuf::addr),
        n_tok: int(toks.n, "tokens")?,
        n_head: int(a.n_head, "heads")?,
        head_dim: int(a.head_dim, "head_dim")?,
        n_rot: int(a.n_rot, "n_rot")?,
        tok_stride: int(a.tok_stride, "row stride")?,
        neox: a.neox as i32,
        theta_base: a.theta_base,
        freq_scale: a.freq_scale,
        attn_factor: a.attn_factor,
        _pad: 0,
    };
    r.launch(
        "rope",
        Launch {
            grid: grid(toks.n * a.n_head)?,
            block: 64,
        },
        p.bytes(),
    )
}

/// `y[r][i] += b[i]` for `rows` rows of `b`'s length (a projection's bias).
pub fn bias<R: Runner>(r: &R, y: &R::Buf, b: &R::Buf, rows: usize, n: usize) -> Result<()> {
    need(y, rows * n, "bias output")?;
    need(b, n, "bias")?;
    if rows * n == 0 {
        return Ok(());
    }
    let p = BiasP {
        y: y.addr(),
        b: b.addr(),
        rows: int(rows, "rows")?,
        n: int(n, "values")?,
    };
    r.launch("bias", elementwise(rows * n)?, p.bytes())
}

/// The gated activations of a feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Glu {
    /// SiLU(g) · u.
    Swiglu = 0,
    /// tanh-approximated GELU(g) · u.
    Geglu = 1,
}

/// `y[i] = act(g[i]) · u[i]` for `n` values.
pub fn glu<R: Runner>(
    r: &R,
    g: &R::Buf,
    u: &R::Buf,
    y: &R::Buf,
    n: usize,
    kind: Glu,
) -> Result<()> {
    for (b, what) in [(g, "gate"), (u, "up"), (y, "output")] {
        need(b, n, what)?;
    }
    if n == 0 {
        return Ok(());
    }
    let p = GluP {
        g: g.addr(),
        u: u.addr(),
        y: y.addr(),
        n: int(n, "values")?,
        kind: kind as i32,
    };
    r.launch("glu", elementwise(n)?, p.bytes())
}

fn elementwise(n: usize) -> Result<Launch> {
    Ok(Launch {
        grid: grid(n.div_ceil(256).min(65_535))?,
        block: 256,
    })
}

/// `y[i] += x[i] · s` for `n` values (`s = 1`: a residual add).
pub fn axpy<R: Runner>(r: &R, y: &R::Buf, x: &R::Buf, n: usize, s: f32) -> Result<()> {
    need(y, n, "axpy output")?;
    need(x, n, "axpy input")?;
    if n == 0 {
        return Ok(());
    }
    let p = AxpyP {
        y: y.addr(),
        x: x.addr(),
        n: int(n, "values")?,
        s,
    };
    r.launch("axpy", elementwise(n)?, p.bytes())
}

/// `x[i] *= s` for `n` values.
pub fn scale<R: Runner>(r: &R, x: &R::Buf, n: usize, s: f32) -> Result<()> {
    need(x, n, "scale input")?;
    if n == 0 {
        return Ok(());
    }
    let p = ScaleP {
        x: x.addr(),
        n: int(n, "values")?,
        s,
    };
    r.launch("scale", elementwise(n)?, p.bytes())
}

/// `y[y_at + i] = x[x_at + i]` for `n` values (ranges that do not overlap).
pub fn copy<R: Runner>(
    r: &R,
    x: &R::Buf,
    x_at: usize,
    y: &R::Buf,
    y_at: usize,
    n: usize,
) -> Result<()> {
    need(x, x_at + n, "copy source")?;
    need(y, y_at + n, "copy destination")?;
    if x.addr() == y.addr() && x_at.max(y_at) < x_at.min(y_at) + n {
        return Err(shape(format!(
            "copy of {n} values from {x_at} to {y_at} overlaps"
        )));
    }
    if n == 0 {
        return Ok(());
    }
    let p = CopyP {
        x: x.addr() + 4 * x_at as u64,
        y: y.addr() + 4 * y_at as u64,
        n: int(n, "values")?,
        _pad: 0,
    };
    r.launch("copy", elementwise(n)?, p.bytes())
}

/// Bytes of keys and values one block of a [`DeviceKv`] takes.
pub fn kv_block_bytes(n_head_kv: usize, head_dim: usize) -> usize {
    2 * BLOCK_SIZE * n_head_kv * head_dim * 4
}

/// One layer's paged key/value cache on the device: a pool of `n_blocks` blocks of
/// [`BLOCK_SIZE`] positions, `[n_blocks · BLOCK_SIZE][n_head_kv][head_dim]` f32 keys and the
/// same of values (the host cache's layout, so its block tables address it).
pub struct DeviceKv<B> {
    pub k: B,
    pub v: B,
    pub n_blocks: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
}

impl<B: DeviceBuf> DeviceKv<B> {
    pub fn new<R: Runner<Buf = B>>(
        r: &R,
        n_blocks: usize,
        n_head_kv: usize,
        head_dim: usize,
    ) -> Result<Self> {
        let n = n_blocks * BLOCK_SIZE * n_head_kv * head_dim;
        int(n, "cache values")?;
        Ok(DeviceKv {
            k: r.alloc(n * 4)?,
            v: r.alloc(n * 4)?,
            n_blocks,
            n_head_kv,
            head_dim,
        })
    }

    /// Copies block `src` into block `dst` (keys and values).
    pub fn copy_block<R: Runner<Buf = B>>(&self, r: &R, src: u32, dst: u32) -> Result<()> {
        let (s, d) = (src as usize, dst as usize);
        if s.max(d) >= self.n_blocks {
            return Err(shape(format!(
                "block {} of a {}-block cache",
                s.max(d),
                self.n_blocks
            )));
        }
        let row = BLOCK_SIZE * self.n_head_kv * self.head_dim;
        for buf in [&self.k, &self.v] {
            copy(r, buf, s * row, buf, d * row, row)?;
        }
        Ok(())
    }

    fn check(&self, toks: &Tokens<B>) -> Result<()> {
        match toks.max_block {
            None if toks.n > 0 => Err(shape("tokens without block tables".into())),
            Some(b) if toks.n > 0 && b as usize >= self.n_blocks => Err(shape(format!(
                "block {b} of a {}-block cache",
                self.n_blocks
            ))),
            _ => Ok(()),
        }
    }
}

/// Writes each token's key and value rows (`[n × n_head_kv·head_dim]`) into `kv` at its
/// position of its sequence.
pub fn kv_write<R: Runner>(
    r: &R,
    kv: &DeviceKv<R::Buf>,
    toks: &Tokens<R::Buf>,
    k: &R::Buf,
    v: &R::Buf,
) -> Result<()> {
    kv.check(toks)?;
    let row = kv.n_head_kv * kv.head_dim;
    need(k, toks.n * row, "keys")?;
    need(v, toks.n * row, "values")?;
    if toks.n == 0 {
        return Ok(());
    }
    let p = KvWriteP {
        k: k.addr(),
        v: v.addr(),
        kc: kv.k.addr(),
        vc: kv.v.addr(),
        blocks: toks.blocks.addr(),
        tbl: toks.tbl.addr(),
        pos: toks.pos.addr(),
        n_tok: int(toks.n, "tokens")?,
        n_head_kv: int(kv.n_head_kv, "KV heads")?,
        head_dim: int(kv.head_dim, "head_dim")?,
        block_shift: BLOCK_SHIFT as i32,
    };
    let dims = Launch {
        grid: grid(toks.n * kv.n_head_kv)?,
        block: 64,
    };
    r.launch("kv_write", dims, p.bytes())
}
/// How a layer's queries attend.
#[derive(Clone, Copy, Debug)]
pub struct AttnShape {
    pub n_head: usize,
    pub scale: f32,
    /// `c · tanh(s / c)` on every score when set.
    pub softcap: Option<f32>,
    /// Only the last `w` positions (a sliding window) when set.
    pub window: Option<usize>,
}

/// Causal attention of every token's queries (`q`: `[n × n_head·head_dim]`) over positions
/// 0..=pos of its slot in `kv`, into `out` (same shape as `q`).
pub fn attention<R: Runner>(
    r: &R,
    kv: &DeviceKv<R::Buf>,
    toks: &Tokens<R::Buf>,
    s: AttnShape,
    q: &R::Buf,
    out: &R::Buf,
) -> Result<()> {
    kv.check(toks)?;
    let hd = kv.head_dim;
    if hd > ATT_MAX_HEAD_DIM || hd == 0 {
        return Err(shape(format!(
            "attention kernels take heads of 1..=256 values, not {hd}"
        )));
    }
    if s.n_head == 0 || kv.n_head_kv == 0 || !s.n_head.is_multiple_of(kv.n_head_kv) {
        return Err(shape(format!(
            "{} query heads over {} KV heads",
            s.n_head, kv.n_head_kv
        )));
    }
    need(q, toks.n * s.n_head * hd, "queries")?;
    need(out, toks.n * s.n_head * hd, "attention output")?;
    if toks.n == 0 {
        return Ok(());
    }
    let p = AttnP {
        q: q.addr(),
        kc: kv.k.addr(),
        vc: kv.v.addr(),
        out: out.addr(),
        blocks: toks.blocks.addr(),
        tbl: toks.tbl.addr(),
        pos: toks.pos.addr(),
        n_tok: int(toks.n, "tokens")?,
        n_head: int(s.n_head, "heads")?,
        n_head_kv: int(kv.n_head_kv, "KV heads")?,
        head_dim: int(hd, "head_dim")?,
        block_shift: BLOCK_SHIFT as i32,
        window: int(s.window.unwrap_or(0), "window")?,
        scale: s.scale,
        softcap: s.softcap.unwrap_or(0.0),
    };
    let dims = Launch {
        grid: grid(toks.n * s.n_head)?,
        block: ATT_THREADS,
    };
    r.launch("attention", dims, p.bytes())
}
