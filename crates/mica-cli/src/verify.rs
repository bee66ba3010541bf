//! `mica verify`: checks every tensor of a `.mica` file against its CRC32C (hardware
//! CRC32C: SSE 4.2 on x86, the CRC extension on ARM) and names each corrupt one. A GGUF
//! file has no checksums; for one, verify reports what opening validated (header, metadata,
//! every tensor's range) and says that the data cannot be checked.

use anyhow::{Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use mica::formats::{GgufFile, MICA_MAGIC, MicaFile};
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The file to check (`.mica`; a GGUF file is only structurally validated).
    pub file: PathBuf,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

fn is_mica(path: &std::path::Path) -> bool {
    let mut magic = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && &magic == MICA_MAGIC
}

pub fn verify(args: VerifyArgs) -> Result<()> {
    if !is_mica(&args.file) {
        let g = GgufFile::open(&args.file)?;
        println!(
            "{}: structure OK ({} tensors); GGUF stores no checksums, so tensor data cannot \
             be verified (convert to .mica to get them)",
            args.file.display(),
            g.tensors().len()
        );
        return Ok(());
    }
    let t0 = Instant::now();
    let m = MicaFile::open(&args.file)?;
    let tensors = m.view().tensors();
    let total: u64 = tensors.iter().map(|t| t.n_bytes).sum();
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} ETA {eta} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    };
    let mut bad = Vec::new();
    for (i, t) in tensors.iter().enumerate() {
        bar.set_message(t.name.clone());
        if let Err(e) = m.verify_tensor(i) {
            bar.suspend(|| eprintln!("{e}"));
            bad.push(t.name.clone());
        }
        bar.inc(t.n_bytes);
    }
    bar.finish_and_clear();
    let secs = t0.elapsed().as_secs_f64();
    if !bad.is_empty() {
        bail!(
            "{}: {} of {} tensors are corrupt: {}",
            args.file.display(),
            bad.len(),
            tensors.len(),
            bad.join(", ")
        );
    }
    println!(
        "{}: OK: header, {} sections and {} tensors ({:.1} MiB) match their CRC32C \
         ({:.2} s, {:.0} MB/s)",
        args.file.display(),
        m.sections().len(),
        tensors.len(),
        total as f64 / (1 << 20) as f64,
        secs,
        total as f64 / 1e6 / secs.max(1e-9)
    );
    Ok(())
}
