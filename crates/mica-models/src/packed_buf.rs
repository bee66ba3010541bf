//! Memory for repacked weight matrices: anonymous pages that the kernel may back with
//! transparent huge pages.
//!
//! Decoding streams every weight byte once per token. On 4 KiB pages that is one TLB entry
//! per 4 KiB read (~60 000 page walks per token for a 250 MB model); on 2 MiB pages it is one
//! per 2 MiB. Where the system's THP mode is `madvise` (a common default), an ordinary heap
//! allocation never gets huge pages: the range has to ask for them. Only the 2 MiB-aligned
//! interior is asked for, so no huge page reaches past the matrix and resident memory stays
//! the bytes written (a THP fault beyond the end would make up to 2 MiB per matrix resident).

use std::io;

const HUGE_PAGE: usize = 2 << 20;

/// A fixed-size, zero-initialised byte buffer (see the module docs).
pub struct PackedBytes {
    map: memmap2::MmapMut,
    /// Start of the buffer inside `map`: the first 2 MiB boundary.
    off: usize,
    len: usize,
}

impl PackedBytes {
    /// `len` zero bytes; their 2 MiB-aligned interior asks for huge pages (a hint: where the
    /// kernel has none to give, the pages are ordinary).
    pub fn zeroed(len: usize) -> io::Result<PackedBytes> {
        // One huge page of address space (not of memory: untouched pages are never resident)
        // to align the start.
        let map = memmap2::MmapMut::map_anon(len + HUGE_PAGE)?;
        let addr = map.as_ptr() as usize;
        let off = addr.next_multiple_of(HUGE_PAGE) - addr;
        let whole = len / HUGE_PAGE * HUGE_PAGE;
        #[cfg(target_os = "linux")]
        if whole > 0 {
            // Failure (no THP in this kernel) only means ordinary pages.
            let _ = map.advise_range(memmap2::Advice::HugePage, off, whole);
        }
        #[cfg(not(target_os = "linux"))]
        let _ = whole;
        Ok(PackedBytes { map, off, len })
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.map[self.off..self.off + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.map[self.off..self.off + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_is_aligned_zeroed_and_writable() {
        for len in [0, 1, 4095, HUGE_PAGE - 1, HUGE_PAGE, 3 * HUGE_PAGE + 17] {
            let mut b = PackedBytes::zeroed(len).unwrap();
            assert_eq!(b.as_slice().len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
            for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = i as u8;
            }
            assert!(b.as_slice().iter().enumerate().all(|(i, &x)| x == i as u8));
        }
    }
}
