//! Writing a file so that the target path only ever holds a complete file.
//!
//! The bytes go to a temporary file beside the target (same directory, so the final rename
//! stays on one file system and is atomic). [`AtomicFile::commit`] flushes, fsyncs the data,
//! renames over the target and fsyncs the directory. Dropping an uncommitted `AtomicFile`
//! (an error, a panic, Ctrl-C unwinding) deletes the temporary file; a process killed
//! outright leaves only the temporary file, never a partial file at the target path.

use crate::error::{FormatError, Result};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A file being written to a temporary path, renamed to its target on commit.
pub struct AtomicFile {
    target: PathBuf,
    temp: PathBuf,
    /// `None` once committed (or after a failed commit removed the file).
    out: Option<BufWriter<File>>,
}

impl AtomicFile {
    /// Creates `.<name>.partial-<pid>` beside `target`.
    pub fn create(target: &Path) -> Result<AtomicFile> {
        let name = target
            .file_name()
            .ok_or_else(|| FormatError::Io {
                path: target.to_path_buf(),
                cause: std::io::Error::other("the output path has no file name"),
            })?
            .to_string_lossy()
            .into_owned();
        let temp = target.with_file_name(format!(".{name}.partial-{}", std::process::id()));
        let file = File::create(&temp).map_err(|cause| FormatError::Io {
            path: temp.clone(),
            cause,
        })?;
        Ok(AtomicFile {
            target: target.to_path_buf(),
            temp,
            out: Some(BufWriter::with_capacity(1 << 20, file)),
        })
    }

    /// The temporary path being written.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// The final path.
    pub fn target(&self) -> &Path {
        &self.target
    }

    fn io(&self, cause: std::io::Error) -> FormatError {
        FormatError::Io {
            path: self.temp.clone(),
            cause,
        }
    }

    fn out(&mut self) -> Result<&mut BufWriter<File>> {
        match self.out.as_mut() {
            Some(o) => Ok(o),
            None => Err(FormatError::Io {
                path: self.temp.clone(),
                cause: std::io::Error::other("the file was already committed"),
            }),
        }
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> Result<()> {
        let r = self.out()?.write_all(bytes);
        r.map_err(|e| self.io(e))
    }

    /// Writes `n` zero bytes.
    pub fn write_zeros(&mut self, n: u64) -> Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut left = n;
        while left > 0 {
            let k = left.min(ZEROS.len() as u64) as usize;
            self.write_all(&ZEROS[..k])?;
            left -= k as u64;
        }
        Ok(())
    }

    /// Overwrites bytes at `offset` (for headers written last), then returns to the end.
    pub fn patch(&mut self, offset: u64, bytes: &[u8]) -> Result<()> {
        fn go(o: &mut BufWriter<File>, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
            o.flush()?;
            o.seek(SeekFrom::Start(offset))?;
            o.write_all(bytes)?;
            o.flush()?;
            o.seek(SeekFrom::End(0))?;
            Ok(())
        }
        let r = go(self.out()?, offset, bytes);
        r.map_err(|e| self.io(e))
    }

    /// Flushes, fsyncs, renames to the target and fsyncs the directory.
    pub fn commit(mut self) -> Result<()> {
        let Some(out) = self.out.take() else {
            return Ok(());
        };
        let file = out.into_inner().map_err(|e| self.io(e.into_error()))?;
        file.sync_all().map_err(|e| self.io(e))?;
        drop(file);
        std::fs::rename(&self.temp, &self.target).map_err(|cause| FormatError::Io {
            path: self.target.clone(),
            cause,
        })?;
        // Make the rename durable. Not every platform can open a directory; that only
        // weakens durability after a power loss, so it is not an error.
        if let Some(dir) = self.target.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.out.take().is_some() {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}
