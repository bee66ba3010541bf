//! The vocabulary held once, compactly: all token texts in one string, all rendered pieces in
//! one byte blob (each with a table of `u32` offsets), and the text → id index as a hash
//! table of bare ids whose keys are read back from the text blob.
//!
//! A 262k-entry vocabulary (Gemma 3) kept as `Vec<String>` plus a `HashMap<String, u32>` plus
//! a `Vec<Box<[u8]>>` of pieces took ~53 MiB of heap in ~790k small allocations (24 bytes of
//! header and a malloc chunk per string, three times over); this layout needs ~9 MiB in a
//! handful of allocations. Lookups cost the same hashing (aHash, as HF's maps use) and one
//! string comparison against the blob.

use hashbrown::HashTable;

use super::error::{Result, TokenizerError};

/// Byte strings laid end to end: entry `i` is `bytes[starts[i]..starts[i + 1]]`.
struct Packed<B> {
    /// A `String` for texts (slicing it yields `&str` with no UTF-8 check), a `Vec<u8>` for
    /// pieces, which may be fragments of characters.
    bytes: B,
    /// `n + 1` offsets into `bytes`, non-decreasing.
    starts: Vec<u32>,
}

impl<B: Blob> Packed<B> {
    fn with_capacity(n: usize, bytes: usize) -> Packed<B> {
        let mut starts = Vec::with_capacity(n + 1);
        starts.push(0);
        Packed {
            bytes: B::with_capacity(bytes),
            starts,
        }
    }

    fn push(&mut self, entry: &B::Entry) -> Result<()> {
        self.bytes.append(entry);
        let end = u32::try_from(self.bytes.len()).map_err(|_| {
            TokenizerError::Backend("the vocabulary's texts exceed 4 GiB".to_string())
        })?;
        self.starts.push(end);
        Ok(())
    }

    /// Entry `i`, if there is one.
    fn get(&self, i: usize) -> Option<&B::Entry> {
        let end = *self.starts.get(i + 1)? as usize;
        Some(self.bytes.slice(self.starts[i] as usize..end))
    }

    /// Entry `i`, which must exist (an id taken from the index).
    fn at(&self, i: usize) -> &B::Entry {
        self.bytes
            .slice(self.starts[i] as usize..self.starts[i + 1] as usize)
    }

    /// The bytes of entry `i`, which must exist: for the index's comparisons, which need no
    /// char-boundary checks.
    fn bytes_at(&self, i: usize) -> &[u8] {
        &self.bytes.as_bytes()[self.starts[i] as usize..self.starts[i + 1] as usize]
    }

    fn len(&self) -> usize {
        self.starts.len() - 1
    }

    fn shrink(&mut self) {
        self.bytes.shrink();
        self.starts.shrink_to_fit();
    }
}

/// What `Packed` needs of its blob: `String` (entries `str`) or `Vec<u8>` (entries `[u8]`).
trait Blob {
    type Entry: ?Sized;
    fn with_capacity(n: usize) -> Self;
    fn append(&mut self, entry: &Self::Entry);
    fn len(&self) -> usize;
    fn slice(&self, range: std::ops::Range<usize>) -> &Self::Entry;
    fn as_bytes(&self) -> &[u8];
    fn shrink(&mut self);
}

impl Blob for String {
    type Entry = str;
    fn with_capacity(n: usize) -> Self {
        String::with_capacity(n)
    }
    fn append(&mut self, entry: &str) {
        self.push_str(entry);
    }
    fn len(&self) -> usize {
        self.len()
    }
    /// Every offset is the end of a whole `&str` appended, so a char boundary.
    fn slice(&self, range: std::ops::Range<usize>) -> &str {
        &self[range]
    }
    fn as_bytes(&self) -> &[u8] {
        self.as_bytes()
    }
    fn shrink(&mut self) {
        self.shrink_to_fit();
    }
}

impl Blob for Vec<u8> {
    type Entry = [u8];
    fn with_capacity(n: usize) -> Self {
        Vec::with_capacity(n)
    }
    fn append(&mut self, entry: &[u8]) {
        self.extend_from_slice(entry);
    }
    fn len(&self) -> usize {
        self.len()
    }
    fn slice(&self, range: std::ops::Range<usize>) -> &[u8] {
        &self[range]
    }
    fn as_bytes(&self) -> &[u8] {
        self
    }
    fn shrink(&mut self) {
        self.shrink_to_fit();
    }
}

/// Token texts (as stored in the file), their rendered pieces, and the text → id index.
pub(crate) struct VocabStore {
    /// Token texts end to end, indexed by id.
    texts: Packed<String>,
    /// Each token's bytes when rendered with special tokens shown (see `vocab::piece_of`).
    pieces: Packed<Vec<u8>>,
    /// Ids, hashed by their text. A text shared by several ids maps to the highest one, as
    /// HF's vocabulary map does.
    index: HashTable<u32>,
    hasher: ahash::RandomState,
}

impl VocabStore {
    /// Stores `texts` (indexed by id) and indexes them. Returns the store and how many texts
    /// were duplicates of an earlier one.
    pub fn new(texts: &[String]) -> Result<(VocabStore, usize)> {
        let n = texts.len();
        let total = texts.iter().map(String::len).sum();
        let mut packed = Packed::<String>::with_capacity(n, total);
        for text in texts {
            packed.push(text)?;
        }
        // Fixed seeds: the table only lives in this process, so any keys do; fixed ones make
        // runs reproducible.
        let hasher = ahash::RandomState::with_seeds(
            0x243f_6a88_85a3_08d3,
            0x1319_8a2e_0370_7344,
            0xa409_3822_299f_31d0,
            0x082e_fa98_ec4e_6c89,
        );
        let mut index = HashTable::with_capacity(n);
        let mut duplicates = 0;
        for (id, text) in texts.iter().enumerate() {
            let text = text.as_bytes();
            let hash = hasher.hash_one(text);
            match index.find_mut(hash, |&other: &u32| packed.bytes_at(other as usize) == text) {
                Some(slot) => {
                    *slot = id as u32;
                    duplicates += 1;
                }
                None => {
                    let rehash = |&other: &u32| hasher.hash_one(packed.bytes_at(other as usize));
                    index.insert_unique(hash, id as u32, rehash);
                }
            }
        }
        let store = VocabStore {
            texts: packed,
            pieces: Packed::with_capacity(0, 0),
            index,
            hasher,
        };
        Ok((store, duplicates))
    }

    /// Sets every token's rendered piece, `piece(id, text)`, in id order.
    pub fn set_pieces<F>(&mut self, mut piece: F) -> Result<()>
    where
        F: FnMut(usize, &str) -> std::borrow::Cow<'_, [u8]>,
    {
        let n = self.len();
        let mut pieces = Packed::<Vec<u8>>::with_capacity(n, self.texts.bytes.len());
        for id in 0..n {
            pieces.push(&piece(id, self.texts.at(id)))?;
        }
        pieces.shrink();
        self.pieces = pieces;
        Ok(())
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// The stored text of `id`.
    pub fn text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize)
    }

    /// The rendered piece of `id` (`None` before [`set_pieces`](Self::set_pieces)).
    pub fn piece(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize)
    }

    /// The id whose text is `text` (the highest, for duplicated texts).
    pub fn id(&self, text: &str) -> Option<u32> {
        // Keys are hashed and compared as bytes (`&[u8]`) everywhere.
        let text = text.as_bytes();
        let hash = self.hasher.hash_one(text);
        let same = |&id: &u32| self.texts.bytes_at(id as usize) == text;
        self.index.find(hash, same).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn store(texts: &[&str]) -> (VocabStore, usize) {
        let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
        VocabStore::new(&texts).unwrap()
    }

    #[test]
    fn texts_and_ids_round_trip() {
        let texts = ["<unk>", "", "▁the", "é", "ab", "a", "b", "<0x0A>"];
        let (s, duplicates) = store(&texts);
        assert_eq!((s.len(), duplicates), (texts.len(), 0));
        for (id, text) in texts.iter().enumerate() {
            assert_eq!(s.text(id as u32), Some(*text));
            assert_eq!(s.id(text), Some(id as u32));
        }
        assert_eq!(s.text(texts.len() as u32), None);
        assert_eq!(s.text(u32::MAX), None);
        // Prefixes, suffixes and concatenations of entries are not entries.
        for missing in ["▁th", "the", "aba", "<0x0", "e\u{301}", "x"] {
            assert_eq!(s.id(missing), None, "{missing:?}");
        }
    }

    #[test]
    fn a_duplicated_text_maps_to_its_highest_id() {
        let (s, duplicates) = store(&["a", "b", "a", "c", "a"]);
        assert_eq!(duplicates, 2);
        assert_eq!(s.id("a"), Some(4));
        assert_eq!(s.id("b"), Some(1));
        assert_eq!(s.text(2), Some("a"));
    }

    #[test]
    fn pieces_are_stored_per_id() {
        let (mut s, _) = store(&["▁a", "<s>", "b"]);
        assert_eq!(s.piece(0), None);
        s.set_pieces(|id, text| match id {
            0 => Cow::Owned(text.replace('▁', " ").into_bytes()),
            1 => Cow::Borrowed(&[]),
            _ => Cow::Borrowed(text.as_bytes()),
        })
        .unwrap();
        assert_eq!(s.piece(0), Some(&b" a"[..]));
        assert_eq!(s.piece(1), Some(&b""[..]));
        assert_eq!(s.piece(2), Some(&b"b"[..]));
        assert_eq!(s.piece(3), None);
    }

    /// Enough entries to make the table grow past its first sizes and probe long chains.
    #[test]
    fn many_entries_all_found() {
        let texts: Vec<String> = (0..50_000).map(|i| format!("t{i:x}")).collect();
        let (s, duplicates) = VocabStore::new(&texts).unwrap();
        assert_eq!(duplicates, 0);
        for (id, text) in texts.iter().enumerate() {
            assert_eq!(s.id(text), Some(id as u32));
        }
        assert_eq!(s.id("t"), None);
    }
}
