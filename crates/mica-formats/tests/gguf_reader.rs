//! GGUF reader: every metadata type round-trips, and every kind of broken file gives an error
//! that names the problem (never a panic).

use mica_formats::ggml_types::GgmlType;
use mica_formats::{FormatError, GgufFile, GgufWriter, MetaArray, MetaValue};
use std::path::PathBuf;

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mica-gguf-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn open_err(name: &str, bytes: &[u8]) -> String {
    let p = tmp(name, bytes);
    match GgufFile::open(&p) {
        Ok(_) => panic!("{name}: expected an error"),
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains(name), "error should name the file: {s}");
            s
        }
    }
}

/// A small valid file: every metadata type, a nested array, two tensors.
fn sample<'a>(f32_data: &'a [u8], q8_data: &'a [u8]) -> GgufWriter<'a> {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("u8", MetaValue::U8(7))
        .meta("i8", MetaValue::I8(-7))
        .meta("u16", MetaValue::U16(65535))
        .meta("i16", MetaValue::I16(-300))
        .meta("u32", MetaValue::U32(4_000_000_000))
        .meta("i32", MetaValue::I32(-5))
        .meta("f32", MetaValue::F32(1.5))
        .meta("bool", MetaValue::Bool(true))
        .meta("u64", MetaValue::U64(u64::MAX))
        .meta("i64", MetaValue::I64(i64::MIN))
        .meta("f64", MetaValue::F64(-2.25))
        .meta(
            "strings",
            MetaValue::Array(MetaArray::String(vec!["a".into(), "é🚀".into(), "".into()])),
        )
        .meta(
            "nested",
            MetaValue::Array(MetaArray::Array(vec![
                MetaArray::I32(vec![1, 2, 3]),
                MetaArray::Array(vec![MetaArray::F64(vec![0.5])]),
            ])),
        )
        .tensor("a", GgmlType(0), &[4, 2], f32_data)
        .tensor("b", GgmlType(8), &[32], q8_data);
    w
}

#[test]
fn every_value_type_round_trips() {
    let f32_data: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
    let q8 = vec![1u8; 34];
    let bytes = sample(&f32_data, &q8).to_bytes();
    let p = tmp("ok.gguf", &bytes);
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
    assert_eq!(g.metadata("i8"), Some(&MetaValue::I8(-7)));
    assert_eq!(g.get_u64("u64"), Some(u64::MAX));
    assert_eq!(g.metadata("i64"), Some(&MetaValue::I64(i64::MIN)));
    assert_eq!(g.get_u32("u32"), Some(4_000_000_000));
    assert_eq!(g.get_u32("u64"), None, "too big for u32");
    assert_eq!(g.get_f32("f32"), Some(1.5));
    assert_eq!(g.get_bool("bool"), Some(true));
    assert_eq!(g.get_str_array("strings").unwrap()[1], "é🚀");
    match g.get_array("nested").unwrap() {
        MetaArray::Array(v) => {
            assert_eq!(v[0], MetaArray::I32(vec![1, 2, 3]));
            assert_eq!(v[1], MetaArray::Array(vec![MetaArray::F64(vec![0.5])]));
        }
        other => panic!("{other:?}"),
    }
    let a = g.tensor("a").unwrap();
    assert_eq!(a.shape, vec![4, 2]);
    assert_eq!(a.n_rows(), 2);
    assert_eq!(g.tensor_data(a), &f32_data[..]);
    assert_eq!(a.offset % 32, 0);
    let b = g.tensor("b").unwrap();
    assert_eq!(g.tensor_data(b), &q8[..]);
}

/// Taking a metadata value out hands it over whole and leaves every other key readable.
#[test]
fn take_metadata_moves_one_value_out() {
    let f32_data = vec![0u8; 32];
    let q8 = vec![1u8; 34];
    let p = tmp("take.gguf", &sample(&f32_data, &q8).to_bytes());
    let mut g = GgufFile::open(&p).unwrap();
    let n = g.metadata_entries().len();
    let strings = MetaArray::String(vec!["a".into(), "é🚀".into(), "".into()]);
    assert_eq!(g.take_metadata("strings"), Some(MetaValue::Array(strings)));
    assert_eq!(g.take_metadata("strings"), None);
    assert_eq!(g.take_metadata("no such key"), None);
    assert_eq!(g.metadata("strings"), None);
    assert_eq!(g.metadata_entries().len(), n - 1);
    // Keys before and after the taken one still find their own values.
    assert_eq!(g.get_f32("f32"), Some(1.5));
    assert_eq!(g.metadata("i8"), Some(&MetaValue::I8(-7)));
    assert!(matches!(g.get_array("nested"), Some(MetaArray::Array(_))));
    assert_eq!(g.get_str("general.architecture"), Some("llama"));
}

#[test]
fn version_2_is_read() {
    let f32_data = vec![0u8; 32];
    let q8 = vec![0u8; 34];
    let mut bytes = sample(&f32_data, &q8).to_bytes();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    let g = GgufFile::open(tmp("v2.gguf", &bytes)).unwrap();
    assert_eq!(g.version(), 2);
}

#[test]
fn truncated_files_are_rejected_at_every_length() {
    let f32_data = vec![0u8; 32];
    let q8 = vec![0u8; 34];
    let bytes = sample(&f32_data, &q8).to_bytes();
    // Every prefix must give an error, never a panic and never success.
    for len in 0..bytes.len() {
        let p = tmp("trunc.gguf", &bytes[..len]);
        let e = GgufFile::open(&p).expect_err("truncated file must fail");
        let s = e.to_string();
        assert!(
            s.contains("truncated") || s.contains("empty") || s.contains("past the end"),
            "len {len}: {s}"
        );
    }
    let s = open_err("trunc-end.gguf", &bytes[..bytes.len() - 1]);
    assert!(
        s.contains("tensor 'b'") && s.contains("past the end"),
        "{s}"
    );
}

/// A GGUF with no tensors (llama.cpp's vocabulary-only `ggml-vocab-*.gguf` files) is valid,
/// whether or not the metadata is padded to the alignment; cut inside its metadata it is not.
#[test]
fn files_without_tensors_are_read() {
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta(
            "tokenizer.ggml.tokens",
            MetaValue::Array(MetaArray::String(vec!["a".into(), "bc".into()])),
        );
    let padded = w.to_bytes();
    // The metadata ends before the padding: where the last string's bytes end.
    let end = padded
        .windows(2)
        .rposition(|b| b == b"bc")
        .map(|p| p + 2)
        .unwrap();
    assert!(end < padded.len(), "the writer pads to the alignment");
    for (name, bytes) in [
        ("vocab-padded.gguf", &padded[..]),
        ("vocab-only.gguf", &padded[..end]),
    ] {
        let g = GgufFile::open(tmp(name, bytes)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(g.tensors().is_empty(), "{name}");
        assert_eq!(
            g.get_array("tokenizer.ggml.tokens").map(MetaArray::len),
            Some(2),
            "{name}"
        );
    }
    let s = open_err("vocab-cut.gguf", &padded[..end - 1]);
    assert!(s.contains("truncated"), "{s}");
}

#[test]
fn wrong_magic() {
    let s = open_err("magic.gguf", b"GGML\x03\0\0\0rest of a file");
    assert!(s.contains("not a GGUF file"), "{s}");
    assert!(s.contains("at byte 0"), "{s}");
}

#[test]
fn bad_versions() {
    let f32_data = vec![0u8; 32];
    let q8 = vec![0u8; 34];
    let mut bytes = sample(&f32_data, &q8).to_bytes();
    bytes[4..8].copy_from_slice(&1u32.to_le_bytes());
    assert!(open_err("v1.gguf", &bytes).contains("version 1"));
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(open_err("be.gguf", &bytes).contains("big-endian"));
    bytes[4..8].copy_from_slice(&99u32.to_le_bytes());
    assert!(open_err("v99.gguf", &bytes).contains("unsupported GGUF version 99"));
}

#[test]
fn absurd_counts_are_rejected_before_allocating() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&u64::MAX.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    assert!(open_err("count.gguf", &bytes).contains("tensor count"));

    // A string length far past the end of the file.
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_le_bytes());
    bytes.extend_from_slice(&0u64.to_le_bytes());
    bytes.extend_from_slice(&1u64.to_le_bytes());
    bytes.extend_from_slice(&(1u64 << 60).to_le_bytes());
    bytes.extend_from_slice(b"key");
    bytes.extend_from_slice(&[0u8; 16]);
    let s = open_err("strlen.gguf", &bytes);
    assert!(s.contains("length of key of metadata entry 0"), "{s}");
}

#[test]
fn tensor_range_past_end_of_file() {
    let f32_data = vec![0u8; 32];
    let mut w = GgufWriter::new();
    w.tensor("blk.0.attn_q.weight", GgmlType(0), &[8], &f32_data);
    let mut bytes = w.to_bytes();
    // Claim a larger shape than the bytes present: patch dims[0] = 8 -> 4096.
    let pos = bytes
        .windows(8)
        .position(|w| w == 8u64.to_le_bytes())
        .unwrap();
    bytes[pos..pos + 8].copy_from_slice(&4096u64.to_le_bytes());
    let s = open_err("range.gguf", &bytes);
    assert!(s.contains("tensor 'blk.0.attn_q.weight'"), "{s}");
    assert!(s.contains("past the end of the file"), "{s}");
}

#[test]
fn shape_overflow() {
    let data = vec![0u8; 4];
    let mut w = GgufWriter::new();
    w.tensor("huge", GgmlType(0), &[1u64 << 40, 1u64 << 40], &data);
    let s = open_err("overflow.gguf", &w.to_bytes());
    assert!(
        s.contains("tensor 'huge'") && s.contains("overflows"),
        "{s}"
    );
}

#[test]
fn unknown_tensor_type_is_named() {
    let data = vec![0u8; 64];
    let mut w = GgufWriter::new();
    w.tensor("weird", GgmlType(77), &[16], &data);
    let s = open_err("type.gguf", &w.to_bytes());
    assert!(
        s.contains("tensor 'weird'") && s.contains("unknown tensor type id 77"),
        "{s}"
    );
}

#[test]
fn known_but_unsupported_type_opens_and_reports_its_name() {
    // I16: ggml knows it, mica does not compute with it. The file opens (so `inspect`
    // can describe it); the type has no DType and is named by its ggml name.
    let data = vec![0u8; 64];
    let mut w = GgufWriter::new();
    w.tensor("i16", GgmlType(25), &[32], &data);
    let g = GgufFile::open(tmp("i16.gguf", &w.to_bytes())).unwrap();
    let t = g.tensor("i16").unwrap();
    assert_eq!(t.dtype(), None);
    assert_eq!(t.ggml_type.name(), "I16");
}

#[test]
fn i_quants_ternary_and_mxfp4_are_read_as_their_types() {
    use mica_kernels::DType;
    let mut w = GgufWriter::new();
    let cases = [
        (16, DType::IQ2_XXS),
        (17, DType::IQ2_XS),
        (18, DType::IQ3_XXS),
        (19, DType::IQ1_S),
        (20, DType::IQ4_NL),
        (21, DType::IQ3_S),
        (22, DType::IQ2_S),
        (23, DType::IQ4_XS),
        (29, DType::IQ1_M),
        (34, DType::TQ1_0),
        (35, DType::TQ2_0),
        (39, DType::MXFP4),
    ];
    let data: Vec<Vec<u8>> = cases
        .iter()
        .map(|(_, t)| vec![0u8; t.row_bytes(512).unwrap()])
        .collect();
    for ((id, _), d) in cases.iter().zip(&data) {
        w.tensor(&format!("t{id}"), GgmlType(*id), &[512], d);
    }
    let g = GgufFile::open(tmp("iquants.gguf", &w.to_bytes())).unwrap();
    for (id, t) in cases {
        let ti = g.tensor(&format!("t{id}")).unwrap();
        assert_eq!(ti.dtype(), Some(t));
        assert_eq!(ti.ggml_type.name(), t.name());
    }
}

#[test]
fn row_not_multiple_of_block() {
    let data = vec![0u8; 34];
    let mut w = GgufWriter::new();
    w.tensor("q", GgmlType(8), &[30], &data);
    let s = open_err("block.gguf", &w.to_bytes());
    assert!(
        s.contains("not a multiple of the Q8_0 block size 32"),
        "{s}"
    );
}

#[test]
fn duplicates_are_rejected() {
    let data = vec![0u8; 4];
    let mut w = GgufWriter::new();
    w.tensor("t", GgmlType(0), &[1], &data)
        .tensor("t", GgmlType(0), &[1], &data);
    assert!(open_err("duptensor.gguf", &w.to_bytes()).contains("duplicate tensor name 't'"));
    let mut w = GgufWriter::new();
    w.meta("k", MetaValue::U8(1)).meta("k", MetaValue::U8(2));
    assert!(open_err("dupkey.gguf", &w.to_bytes()).contains("duplicate metadata key 'k'"));
}

#[test]
fn bad_alignment_and_misaligned_offsets() {
    let data = vec![0u8; 4];
    let mut w = GgufWriter::new();
    w.meta("general.alignment", MetaValue::U32(24))
        .tensor("t", GgmlType(0), &[1], &data);
    let e = GgufFile::open(tmp("align.gguf", &w.to_bytes())).unwrap_err();
    assert!(matches!(e, FormatError::Metadata { .. }), "{e}");
    assert!(e.to_string().contains("power of two"));

    let mut w = GgufWriter::new();
    w.tensor("a", GgmlType(0), &[1], &data)
        .tensor("b", GgmlType(0), &[1], &data);
    let mut bytes = w.to_bytes();
    // b's offset is 32; make it 4.
    let pos = bytes
        .windows(9)
        .position(|w| w[0] == b'b' && w[1..] == [1, 0, 0, 0, 1, 0, 0, 0][..])
        .unwrap();
    let off_pos = pos + 1 + 4 + 8 + 4;
    assert_eq!(bytes[off_pos..off_pos + 8], 32u64.to_le_bytes());
    bytes[off_pos..off_pos + 8].copy_from_slice(&4u64.to_le_bytes());
    let s = open_err("misaligned.gguf", &bytes);
    assert!(s.contains("not a multiple of the alignment"), "{s}");
}

#[test]
fn bad_values() {
    let mut w = GgufWriter::new();
    w.meta("b", MetaValue::Bool(true));
    let mut bytes = w.to_bytes();
    let pos = bytes.iter().rposition(|&x| x == 1).unwrap();
    bytes[pos] = 5;
    assert!(open_err("bool.gguf", &bytes).contains("not 0 or 1"));

    let mut w = GgufWriter::new();
    w.meta("s", MetaValue::String("ab".into()));
    let mut bytes = w.to_bytes();
    let pos = bytes.windows(2).rposition(|x| x == b"ab").unwrap();
    bytes[pos] = 0xff;
    assert!(open_err("utf8.gguf", &bytes).contains("not valid UTF-8"));

    let mut w = GgufWriter::new();
    w.meta("x", MetaValue::U8(1));
    let mut bytes = w.to_bytes();
    // value type sits right after the key "x"
    let pos = bytes.windows(1).position(|x| x == b"x").unwrap() + 1;
    bytes[pos..pos + 4].copy_from_slice(&42u32.to_le_bytes());
    assert!(open_err("vtype.gguf", &bytes).contains("unknown metadata value type 42"));
}

#[test]
fn missing_file_names_the_path() {
    let e = GgufFile::open("/nonexistent/dir/model.gguf").unwrap_err();
    assert!(e.to_string().contains("/nonexistent/dir/model.gguf"));
}
