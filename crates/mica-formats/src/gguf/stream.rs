//! A streaming GGUF v3 writer for conversions: the header (metadata and every tensor's
//! offset) is written first, since each tensor's size follows from its type and shape; the
//! tensor data then streams in, one tensor and one chunk at a time, through an
//! [`AtomicFile`] so an interrupted conversion leaves nothing at the target path.

use super::DEFAULT_ALIGNMENT;
use super::metadata::MetaValue;
use super::writer::{put_kv_list, put_str};
use crate::atomic::AtomicFile;
use crate::error::{FormatError, Result};
use crate::ggml_types::GgmlType;
use crate::sink::TensorSink;
use std::path::{Path, PathBuf};

/// One tensor as declared up front: name, type, shape (innermost first).
#[derive(Clone, Debug)]
pub struct TensorDecl {
    pub name: String,
    pub ggml_type: GgmlType,
    pub shape: Vec<u64>,
}

/// Writes a GGUF file whose tensors were all declared at creation, in that order.
pub struct GgufStreamWriter {
    file: AtomicFile,
    decls: Vec<TensorDecl>,
    sizes: Vec<u64>,
    /// Index of the next tensor to begin.
    next: usize,
    /// Bytes of the current tensor written so far (`None` between tensors).
    current: Option<u64>,
    /// Bytes written since the start of the data section.
    data_pos: u64,
    written: u64,
    alignment: u64,
}

impl GgufStreamWriter {
    /// Creates the file at a temporary path and writes the header. `metadata` must not
    /// hold `general.alignment` with a value other than a power of two.
    pub fn create(
        target: &Path,
        metadata: &[(String, MetaValue)],
        decls: Vec<TensorDecl>,
    ) -> Result<GgufStreamWriter> {
        let meta_err = |key: &str, msg: String| FormatError::Metadata {
            path: target.to_path_buf(),
            key: key.to_string(),
            msg,
        };
        let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(meta_err(
                        "general.alignment",
                        format!("{v} is not a power of two"),
                    ));
                }
            },
        };
        let mut sizes = Vec::with_capacity(decls.len());
        for d in &decls {
            let n = d
                .ggml_type
                .n_bytes(&d.shape)
                .ok_or_else(|| FormatError::Tensor {
                    path: target.to_path_buf(),
                    tensor: d.name.clone(),
                    msg: format!(
                        "shape {:?} does not fit type {}",
                        d.shape,
                        d.ggml_type.name()
                    ),
                })?;
            sizes.push(n);
        }
        let mut head = Vec::new();
        head.extend_from_slice(super::GGUF_MAGIC);
        head.extend_from_slice(&3u32.to_le_bytes());
        head.extend_from_slice(&(decls.len() as u64).to_le_bytes());
        // put_kv_list writes the count then the entries, as GGUF's header does here.
        put_kv_list(&mut head, metadata);
        let mut offset = 0u64;
        for (d, &n) in decls.iter().zip(&sizes) {
            put_str(&mut head, &d.name);
            head.extend_from_slice(&(d.shape.len() as u32).to_le_bytes());
            for x in &d.shape {
                head.extend_from_slice(&x.to_le_bytes());
            }
            head.extend_from_slice(&d.ggml_type.0.to_le_bytes());
            head.extend_from_slice(&offset.to_le_bytes());
            offset = (offset + n).div_ceil(alignment) * alignment;
        }
        let padded = (head.len() as u64).div_ceil(alignment) * alignment;
        head.resize(padded as usize, 0);
        let mut file = AtomicFile::create(target)?;
        file.write_all(&head)?;
        Ok(GgufStreamWriter {
            file,
            decls,
            sizes,
            next: 0,
            current: None,
            data_pos: 0,
            written: padded,
            alignment,
        })
    }

    fn err(&self, tensor: &str, msg: String) -> FormatError {
        FormatError::Tensor {
            path: self.file.target().to_path_buf(),
            tensor: tensor.to_string(),
            msg,
        }
    }

    fn target(&self) -> PathBuf {
        self.file.target().to_path_buf()
    }
}

impl TensorSink for GgufStreamWriter {
    fn begin_tensor(&mut self, name: &str, ggml_type: GgmlType, shape: &[u64]) -> Result<()> {
        if self.current.is_some() {
            return Err(self.err(name, "the previous tensor was not ended".into()));
        }
        let Some(d) = self.decls.get(self.next) else {
            return Err(self.err(name, "more tensors than declared".into()));
        };
        if d.name != name || d.ggml_type != ggml_type || d.shape != shape {
            let msg = format!(
                "tensors must come in the declared order; expected '{}' {} {:?}",
                d.name,
                d.ggml_type.name(),
                d.shape
            );
            return Err(self.err(name, msg));
        }
        let pad = self.data_pos.div_ceil(self.alignment) * self.alignment - self.data_pos;
        self.file.write_zeros(pad)?;
        self.data_pos += pad;
        self.written += pad;
        self.current = Some(0);
        Ok(())
    }

    fn write_data(&mut self, bytes: &[u8]) -> Result<()> {
        let name = self.decls.get(self.next).map(|d| d.name.clone());
        let Some(done) = self.current else {
            return Err(self.err(&name.unwrap_or_default(), "data outside a tensor".into()));
        };
        let want = self.sizes[self.next];
        if done + bytes.len() as u64 > want {
            return Err(self.err(
                &name.unwrap_or_default(),
                format!("more than its {want} bytes"),
            ));
        }
        self.file.write_all(bytes)?;
        self.current = Some(done + bytes.len() as u64);
        self.data_pos += bytes.len() as u64;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn end_tensor(&mut self) -> Result<()> {
        let d = &self.decls[self.next.min(self.decls.len().saturating_sub(1))];
        let want = self.sizes.get(self.next).copied().unwrap_or(0);
        match self.current {
            Some(n) if n == want => {
                self.current = None;
                self.next += 1;
                Ok(())
            }
            Some(n) => Err(self.err(&d.name, format!("got {n} bytes, its shape needs {want}"))),
            None => Err(self.err(&d.name, "no tensor was begun".into())),
        }
    }

    fn finish(self: Box<Self>) -> Result<()> {
        if self.next != self.decls.len() || self.current.is_some() {
            return Err(FormatError::Io {
                path: self.target(),
                cause: std::io::Error::other(format!(
                    "only {} of {} declared tensors were written",
                    self.next,
                    self.decls.len()
                )),
            });
        }
        self.file.commit()
    }

    fn bytes_written(&self) -> u64 {
        self.written
    }
}
