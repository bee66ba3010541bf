//! safetensors reader: a valid file (and a sharded checkpoint) reads back exactly; every kind
//! of broken file or index gives an error naming the file and the tensor or shard.

use mica_formats::{CheckpointSet, FormatError, SafetensorsFile};
use std::path::PathBuf;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("mica-st-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A safetensors file of `(name, dtype, shape, bytes)` tensors.
fn file(tensors: &[(&str, &str, &[u64], Vec<u8>)]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape,
                               "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    out
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn reads_tensors_and_shapes_innermost_first() {
    let d = tmpdir("ok");
    let p = d.join("model.safetensors");
    let bf16 = vec![0x80, 0x3f, 0x00, 0x40]; // 1.0, 2.0
    std::fs::write(
        &p,
        file(&[
            ("w", "F32", &[2, 3], f32s(&[1., 2., 3., 4., 5., 6.])),
            ("b", "BF16", &[2], bf16.clone()),
        ]),
    )
    .unwrap();
    let f = SafetensorsFile::open(&p).unwrap();
    let w = f.tensor("w").unwrap();
    assert_eq!(w.shape, vec![3, 2], "a [2, 3] matrix: rows of 3");
    assert_eq!(f.tensor_data(w), &f32s(&[1., 2., 3., 4., 5., 6.])[..]);
    let b = f.tensor("b").unwrap();
    assert_eq!(b.dtype(), Some(mica_kernels::DType::BF16));
    assert_eq!(f.tensor_data(b), &bf16[..]);
    assert_eq!(f.metadata(), &[("format".to_string(), "pt".to_string())]);
    let set = CheckpointSet::open_dir(&d).unwrap();
    assert!(set.tensor("w").is_some());
}

fn open_err(bytes: Vec<u8>) -> String {
    let d = tmpdir("bad");
    let p = d.join("broken.safetensors");
    std::fs::write(&p, bytes).unwrap();
    match SafetensorsFile::open(&p) {
        Ok(_) => panic!("expected an error"),
        Err(e) => {
            let s = e.to_string();
            assert!(s.contains("broken.safetensors"), "names the file: {s}");
            s
        }
    }
}

#[test]
fn broken_files_are_clear_errors() {
    assert!(open_err(vec![1, 2, 3]).contains("too short"));
    assert!(open_err(1000u64.to_le_bytes().to_vec()).contains("header length"));
    let mut not_json = 4u64.to_le_bytes().to_vec();
    not_json.extend(b"nope");
    assert!(open_err(not_json).contains("not valid JSON"));
    let e = open_err(file(&[("t", "F8_E4M3", &[2], vec![0, 0])]));
    assert!(e.contains("'t'") && e.contains("F8_E4M3"), "{e}");
    let e = open_err(file(&[("t", "F32", &[3], f32s(&[1., 2.]))]));
    assert!(e.contains("'t'") && e.contains("needs 12 bytes"), "{e}");
    let mut truncated = file(&[("t", "F32", &[2], f32s(&[1., 2.]))]);
    truncated.truncate(truncated.len() - 1);
    let e = open_err(truncated);
    assert!(e.contains("past the end"), "{e}");
}

#[test]
fn sharded_checkpoints_name_missing_shards_and_tensors() {
    let d = tmpdir("shards");
    std::fs::write(
        d.join("a.safetensors"),
        file(&[("x", "F32", &[1], f32s(&[1.]))]),
    )
    .unwrap();
    std::fs::write(
        d.join("b.safetensors"),
        file(&[("y", "F16", &[1], vec![0, 0x3c])]),
    )
    .unwrap();
    let index = |map: serde_json::Value| {
        std::fs::write(
            d.join("model.safetensors.index.json"),
            serde_json::to_vec(&serde_json::json!({"weight_map": map})).unwrap(),
        )
        .unwrap()
    };
    index(serde_json::json!({"x": "a.safetensors", "y": "b.safetensors"}));
    let set = CheckpointSet::open_dir(&d).unwrap();
    assert_eq!(set.files.len(), 2);
    assert_eq!(set.tensor("y").unwrap().0.path(), d.join("b.safetensors"));

    index(serde_json::json!({"x": "a.safetensors", "z": "c.safetensors"}));
    let e = CheckpointSet::open_dir(&d).err().unwrap().to_string();
    assert!(e.contains("c.safetensors") && e.contains("'z'"), "{e}");

    index(serde_json::json!({"x": "a.safetensors", "w": "b.safetensors"}));
    let e = CheckpointSet::open_dir(&d).err().unwrap();
    assert!(matches!(e, FormatError::Tensor { .. }));
    let e = e.to_string();
    assert!(e.contains("b.safetensors") && e.contains("'w'"), "{e}");

    let empty = tmpdir("empty");
    let e = CheckpointSet::open_dir(&empty).err().unwrap().to_string();
    assert!(e.contains("model.safetensors"), "{e}");
}
