//! `.mica` v1: files written by `MicaWriter` read back identically (metadata split into
//! sections and joined again, tensors at 4096-byte offsets with their checksums), and every
//! kind of damage — a flipped data byte, truncation, bad magic, a bad header checksum, an
//! unknown dtype or required flag — gives a clear error naming the file and the place.
//! An unfinished or failed write leaves nothing at the target path.

use mica_formats::ggml_types::GgmlType;
use mica_formats::gguf::TensorDecl;
use mica_formats::mica::{ALIGNMENT, FIXED_HEADER, SECTION_ENTRY};
use mica_formats::{
    Container, GgufFile, GgufStreamWriter, MetaArray, MetaValue, MicaFile, MicaWriter, TensorSink,
};
use std::path::PathBuf;

fn dir(test: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mica-format-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn metadata() -> Vec<(String, MetaValue)> {
    let s = |v: &str| MetaValue::String(v.into());
    vec![
        ("general.architecture".into(), s("llama")),
        ("general.name".into(), s("tiny")),
        ("llama.block_count".into(), MetaValue::U32(2)),
        ("llama.rope.freq_base".into(), MetaValue::F32(10000.0)),
        ("tokenizer.ggml.model".into(), s("gpt2")),
        (
            "tokenizer.ggml.tokens".into(),
            MetaValue::Array(MetaArray::String(vec!["a".into(), "b".into()])),
        ),
        ("tokenizer.chat_template".into(), s("{{ x }}")),
        ("general.alignment".into(), MetaValue::U32(32)),
    ]
}

/// F32 [3] and Q8_0 [64, 2] (4 blocks of 34 bytes).
fn tensors() -> Vec<(&'static str, GgmlType, Vec<u64>, Vec<u8>)> {
    let f32s: Vec<u8> = [1.0f32, -2.0, 3.5]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let q8: Vec<u8> = (0..4 * 34).map(|i| (i * 7 % 251) as u8).collect();
    vec![
        ("norm.weight", GgmlType(0), vec![3], f32s),
        ("blk.0.attn_q.weight", GgmlType(8), vec![64, 2], q8),
    ]
}

fn write_sample(path: &std::path::Path) {
    let prov = vec![(
        "mica.converter".to_string(),
        MetaValue::String("test".into()),
    )];
    let mut w = MicaWriter::create(path, &metadata(), &prov).unwrap();
    for (name, ty, shape, data) in tensors() {
        // Two chunks, to exercise streaming.
        w.begin_tensor(name, ty, &shape).unwrap();
        let (a, b) = data.split_at(data.len() / 2);
        w.write_data(a).unwrap();
        w.write_data(b).unwrap();
        w.end_tensor().unwrap();
    }
    Box::new(w).finish().unwrap();
}

#[test]
fn round_trip() {
    let d = dir("rt");
    let p = d.join("m.mica");
    write_sample(&p);
    let m = MicaFile::open(&p).unwrap();
    assert_eq!(m.version(), (1, 0));
    assert_eq!(m.provenance().len(), 1);
    let v = m.view();
    assert_eq!(v.container(), Container::Mica);
    // Every key but the alignment comes back, with its type.
    let want: Vec<_> = metadata()
        .into_iter()
        .filter(|(k, _)| k != "general.alignment")
        .collect();
    assert_eq!(v.metadata_entries().len(), want.len());
    for (k, val) in &want {
        assert_eq!(v.metadata(k), Some(val), "{k}");
    }
    for (i, (name, ty, shape, data)) in tensors().into_iter().enumerate() {
        let t = v.tensor(name).unwrap();
        assert_eq!((t.ggml_type, &t.shape), (ty, &shape));
        assert_eq!(t.offset % ALIGNMENT, 0);
        assert_eq!(v.tensor_data(t), &data[..]);
        m.verify_tensor(i).unwrap();
    }
    // GgufFile::open picks the reader by the magic.
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.container(), Container::Mica);
    assert_eq!(g.tensors().len(), 2);
}

#[test]
fn mica_to_gguf_streaming_round_trip() {
    let d = dir("gguf");
    let p = d.join("m.mica");
    write_sample(&p);
    let m = GgufFile::open(&p).unwrap();
    let out = d.join("m.gguf");
    let decls = m
        .tensors()
        .iter()
        .map(|t| TensorDecl {
            name: t.name.clone(),
            ggml_type: t.ggml_type,
            shape: t.shape.clone(),
        })
        .collect();
    let mut w = GgufStreamWriter::create(&out, m.metadata_entries(), decls).unwrap();
    for t in m.tensors() {
        w.begin_tensor(&t.name, t.ggml_type, &t.shape).unwrap();
        w.write_data(m.tensor_data(t)).unwrap();
        w.end_tensor().unwrap();
    }
    Box::new(w).finish().unwrap();
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.container(), Container::Gguf);
    assert_eq!(g.metadata_entries(), m.metadata_entries());
    for t in m.tensors() {
        assert_eq!(g.tensor_data(g.tensor(&t.name).unwrap()), m.tensor_data(t));
    }
}

fn open_err(p: &std::path::Path) -> String {
    match MicaFile::open(p) {
        Ok(_) => panic!("{}: expected an error", p.display()),
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains(&p.display().to_string()), "names the file: {s}");
            s
        }
    }
}

#[test]
fn flipped_data_byte_is_named_by_verify() {
    let d = dir("flip");
    let p = d.join("m.mica");
    write_sample(&p);
    let off = {
        let m = MicaFile::open(&p).unwrap();
        m.view().tensor("blk.0.attn_q.weight").unwrap().offset + 5
    };
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[off as usize] ^= 0x10;
    std::fs::write(&p, &bytes).unwrap();
    // Opening is cheap and does not read tensor data; verification finds it.
    let m = MicaFile::open(&p).unwrap();
    m.verify_tensor(0).unwrap();
    let e = m.verify_tensor(1).unwrap_err().to_string();
    assert!(
        e.contains("blk.0.attn_q.weight") && e.contains("corrupt"),
        "{e}"
    );
}

#[test]
fn truncated_file_is_refused() {
    let d = dir("trunc");
    let p = d.join("m.mica");
    write_sample(&p);
    let bytes = std::fs::read(&p).unwrap();
    for cut in [0usize, 7, 30, 100, bytes.len() - 1] {
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let e = open_err(&p);
        assert!(
            e.contains("truncated") || e.contains("magic"),
            "cut {cut}: {e}"
        );
    }
}

#[test]
fn bad_magic_and_bad_header_checksum_are_refused() {
    let d = dir("magic");
    let p = d.join("m.mica");
    write_sample(&p);
    let good = std::fs::read(&p).unwrap();
    let mut b = good.clone();
    b[1] = b'X';
    std::fs::write(&p, &b).unwrap();
    // Through GgufFile::open, a file that is neither is "not a GGUF file".
    assert!(GgufFile::open(&p).is_err());
    assert!(open_err(&p).contains("magic"));
    // A changed section offset in the table breaks the header checksum.
    let mut b = good.clone();
    b[FIXED_HEADER + 8] ^= 1;
    std::fs::write(&p, &b).unwrap();
    let e = open_err(&p);
    assert!(e.contains("header checksum mismatch"), "{e}");
    // Newer major version: refused by name.
    let mut b = good.clone();
    b[8] = 2;
    std::fs::write(&p, &b).unwrap();
    let e = open_err(&p);
    assert!(e.contains("version 2.0 is not supported"), "{e}");
}

/// Rewrites the header checksum after an edit (to test checks behind it).
fn reseal(b: &mut [u8]) {
    let n = u32::from_le_bytes(b[20..24].try_into().unwrap()) as usize;
    let at = FIXED_HEADER + SECTION_ENTRY * n;
    let crc = crc32c_of(&b[..at]);
    b[at..at + 4].copy_from_slice(&crc.to_le_bytes());
}

/// Bitwise CRC32C (Castagnoli, reflected), independent of the crate under test.
fn crc32c_of(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &x in data {
        crc ^= x as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32c_is_castagnoli() {
    assert_eq!(crc32c_of(b"123456789"), 0xE306_9283);
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
}

#[test]
fn unknown_required_flag_and_unknown_dtype_are_refused() {
    let d = dir("unknown");
    let p = d.join("m.mica");
    write_sample(&p);
    let good = std::fs::read(&p).unwrap();
    let mut b = good.clone();
    b[12] = 0x04;
    reseal(&mut b);
    std::fs::write(&p, &b).unwrap();
    assert!(open_err(&p).contains("required flags"));
    // An unknown optional flag is ignored.
    let mut b = good.clone();
    b[16] = 0x80;
    reseal(&mut b);
    std::fs::write(&p, &b).unwrap();
    MicaFile::open(&p).unwrap();

    // Unknown dtype: rewrite the norm's dtype id (0) in the directory to 200 and fix the
    // directory's section checksum and then the header's.
    let m = MicaFile::open(&p).unwrap();
    let (sec_idx, dir_sec) = m
        .sections()
        .iter()
        .enumerate()
        .find(|(_, s)| s.kind == mica_formats::mica::SectionKind::TensorDirectory)
        .map(|(i, s)| (i, *s))
        .unwrap();
    drop(m);
    let mut b = good.clone();
    // count u64, name len u64, "norm.weight", dtype u32
    let at = dir_sec.offset as usize + 8 + 8 + "norm.weight".len();
    assert_eq!(&b[at..at + 4], &0u32.to_le_bytes());
    b[at..at + 4].copy_from_slice(&200u32.to_le_bytes());
    let sec = &b[dir_sec.offset as usize..(dir_sec.offset + dir_sec.size) as usize];
    let crc = crc32c_of(sec);
    let entry = FIXED_HEADER + SECTION_ENTRY * sec_idx;
    b[entry + 24..entry + 28].copy_from_slice(&crc.to_le_bytes());
    reseal(&mut b);
    std::fs::write(&p, &b).unwrap();
    let e = open_err(&p);
    assert!(
        e.contains("norm.weight") && e.contains("unknown dtype id 200"),
        "{e}"
    );
}

#[test]
fn corrupt_section_is_refused() {
    let d = dir("section");
    let p = d.join("m.mica");
    write_sample(&p);
    let m = MicaFile::open(&p).unwrap();
    let tok = m.sections()[1];
    drop(m);
    let mut b = std::fs::read(&p).unwrap();
    b[tok.offset as usize + 10] ^= 0xff;
    std::fs::write(&p, &b).unwrap();
    let e = open_err(&p);
    assert!(e.contains("Tokenizer") && e.contains("corrupt"), "{e}");
}

#[test]
fn failed_or_abandoned_write_leaves_no_file() {
    let d = dir("atomic");
    let p = d.join("m.mica");
    // A writer dropped midway (as on an error or a panic unwinding).
    {
        let mut w = MicaWriter::create(&p, &metadata(), &[]).unwrap();
        w.begin_tensor("norm.weight", GgmlType(0), &[3]).unwrap();
        w.write_data(&[0u8; 4]).unwrap();
    }
    // A writer given bad data: the error is reported and nothing is left.
    {
        let mut w = MicaWriter::create(&p, &metadata(), &[]).unwrap();
        w.begin_tensor("norm.weight", GgmlType(0), &[3]).unwrap();
        assert!(w.write_data(&[0u8; 16]).is_err());
        assert!(w.end_tensor().is_err());
        assert!(Box::new(w).finish().is_err());
    }
    // A GGUF writer missing a declared tensor cannot finish.
    {
        let decls = vec![TensorDecl {
            name: "norm.weight".into(),
            ggml_type: GgmlType(0),
            shape: vec![3],
        }];
        let w = GgufStreamWriter::create(&d.join("m.gguf"), &metadata(), decls).unwrap();
        assert!(Box::new(w).finish().is_err());
    }
    let left: Vec<_> = std::fs::read_dir(&d).unwrap().flatten().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
