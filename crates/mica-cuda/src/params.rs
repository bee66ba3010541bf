//! The kernels' parameter structs, field for field as `kernels/*.cu` declare them (each
//! kernel takes one by value). Pointers are device addresses as `u64`. Every struct is
//! laid out without implicit padding (a trailing `_pad` where C would pad), so its bytes
//! are all initialized; the emulator checks each struct's size against the C compiler's
//! at every launch.

/// A kernel parameter struct: plain data, no padding.
pub trait Params: Copy {
    /// The struct's bytes, as the kernel reads them.
    fn bytes(&self) -> &[u8];
}

macro_rules! params {
    ($(#[$doc:meta])* $name:ident { $($field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default)]
        pub struct $name {
            $(pub $field: $ty),*
        }

        impl Params for $name {
            fn bytes(&self) -> &[u8] {
                const { assert!(std::mem::size_of::<$name>() == 0 $(+ std::mem::size_of::<$ty>())*) };
                // SAFETY: `repr(C)` plain data whose size is the sum of its fields' (checked
                // above at compile time), so every byte belongs to an initialized field.
                unsafe {
                    std::slice::from_raw_parts(
                        (self as *const $name).cast::<u8>(),
                        std::mem::size_of::<$name>(),
                    )
                }
            }
        }
    };
}

params!(
    /// `matvec_*` (`kernels/matvec.cu`).
    MatvecP {
        w: u64,
        x: u64,
        y: u64,
        rows: i32,
        cols: i32,
        n: i32,
        row_bytes: i32,
        x_stride: i32,
        y_stride: i32,
    }
);

params!(
    /// `get_rows_*` (`kernels/matvec.cu`).
    RowsP {
        w: u64,
        ids: u64,
        y: u64,
        n: i32,
        cols: i32,
        row_bytes: i32,
        _pad: i32,
    }
);

params!(
    /// `rms_norm` (`kernels/elementwise.cu`).
    NormP {
        x: u64,
        w: u64,
        y: u64,
        rows: i32,
        cols: i32,
        eps: f32,
        _pad: i32,
    }
);

params!(
    /// `rope` (`kernels/elementwise.cu`).
    RopeP {
        x: u64,
        pos: u64,
        factors: u64,
        n_tok: i32,
        n_head: i32,
        head_dim: i32,
        n_rot: i32,
        tok_stride: i32,
        neox: i32,
        theta_base: f32,
        freq_scale: f32,
        attn_factor: f32,
        _pad: i32,
    }
);

params!(
    /// `bias` (`kernels/elementwise.cu`).
    BiasP {
        y: u64,
        b: u64,
        rows: i32,
        n: i32,
    }
);

params!(
    /// `glu` (`kernels/elementwise.cu`).
    GluP {
        g: u64,
        u: u64,
        y: u64,
        n: i32,
        kind: i32,
    }
);

params!(
    /// `axpy` (`kernels/elementwise.cu`).
    AxpyP {
        y: u64,
        x: u64,
        n: i32,
        s: f32,
    }
);

params!(
    /// `scale` (`kernels/elementwise.cu`).
    ScaleP {
        x: u64,
        n: i32,
        s: f32,
    }
);

params!(
    /// `copy` (`kernels/elementwise.cu`).
    CopyP {
        x: u64,
        y: u64,
        n: i32,
        _pad: i32,
    }
);

params!(
    /// `kv_write` (`kernels/attention.cu`).
    KvWriteP {
        k: u64,
        v: u64,
        kc: u64,
        vc: u64,
        blocks: u64,
        tbl: u64,
        pos: u64,
        n_tok: i32,
        n_head_kv: i32,
        head_dim: i32,
        block_shift: i32,
    }
);

params!(
    /// `attention` (`kernels/attention.cu`).
    AttnP {
        q: u64,
        kc: u64,
        vc: u64,
        out: u64,
        blocks: u64,
        tbl: u64,
        pos: u64,
        n_tok: i32,
        n_head: i32,
        n_head_kv: i32,
        head_dim: i32,
        block_shift: i32,
        window: i32,
        scale: f32,
        softcap: f32,
    }
);
