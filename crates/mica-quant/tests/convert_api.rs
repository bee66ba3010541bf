//! `mica_quant::convert` called as a library: the tiny F32 LLaMA of `fixtures/hf/llama`
//! (a GGUF written by llama.cpp's converter) to Q8_0, checked tensor by tensor against
//! `mica-kernels`' quantizer run on the source rows; the progress events bracket the write and
//! sum to its total; a mix reports the types it wrote; bad options are typed errors that name
//! what failed and leave no file. Gemma 4 MoE to Q8_0 gives llama.cpp's own Q8_0 file, tensor for
//! tensor.

use mica_formats::{GgufFile, MicaFile};
use mica_kernels::DType;
use mica_kernels::quant::quantize_row;
use mica_quant::{
    ConvertOptions, Event, FileType, Imatrix, Importance, Notice, QuantError, Task, TensorTypeRule,
    convert,
};
use std::path::PathBuf;
use std::sync::Arc;

fn source() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/hf/llama/model-f32.gguf")
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir()
        .join(format!("mica-quant-test-{}", std::process::id()))
        .join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a conversion, collecting its events.
fn run(
    out: &std::path::Path,
    opts: &ConvertOptions,
) -> (mica_quant::Result<mica_quant::ConvertReport>, Vec<Event>) {
    let mut events = Vec::new();
    let r = convert(&source(), out, opts, &mut |e| events.push(e));
    (r, events)
}

fn q8_0() -> ConvertOptions {
    ConvertOptions {
        file_type: Some(FileType::Q8_0),
        threads: 2,
        ..ConvertOptions::default()
    }
}

#[test]
fn q8_0_is_the_kernels_quantizer_on_every_matrix_and_progress_sums_to_the_total() {
    let out = scratch("q8").join("q8.gguf");
    let (report, events) = run(&out, &q8_0());
    let report = report.unwrap();
    let src = GgufFile::open(source()).unwrap();
    let got = GgufFile::open(&out).unwrap();
    assert_eq!(got.get_u32("general.file_type"), Some(7));
    assert_eq!(report.tensors, src.tensors().len());

    let mut quantized = 0;
    for t in src.tensors() {
        let u = got.tensor(&t.name).unwrap();
        let data = src.tensor_data(t);
        if t.shape.len() == 1 {
            assert_eq!(u.ggml_type, t.ggml_type, "{}", t.name);
            assert!(
                got.tensor_data(u) == data,
                "{}: 1-D tensors are copied",
                t.name
            );
            continue;
        }
        assert_eq!(u.ggml_type.dtype(), Some(DType::Q8_0), "{}", t.name);
        // The source rows quantized by mica-kernels directly.
        let cols = t.shape[0] as usize;
        let row_bytes = DType::Q8_0.row_bytes(cols).unwrap();
        let mut want = vec![0u8; row_bytes * t.n_rows() as usize];
        let floats: Vec<f32> = data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        for (row, dst) in floats.chunks(cols).zip(want.chunks_mut(row_bytes)) {
            quantize_row(DType::Q8_0, row, dst);
        }
        assert!(got.tensor_data(u) == want.as_slice(), "{}", t.name);
        quantized += 1;
    }
    assert_eq!(report.converted, quantized);
    assert!(quantized >= 14, "{quantized} matrices");
    // It runs.
    mica_models::arch::load_gguf(Arc::new(got)).unwrap();

    // Events: one write task, an item per tensor in file order, advances summing to the
    // tensor bytes, then the end.
    let start = events
        .iter()
        .position(|e| matches!(e, Event::Start { .. }))
        .unwrap();
    assert_eq!(
        events[start],
        Event::Start {
            task: Task::Write,
            total: report.tensor_bytes
        }
    );
    let advanced: u64 = events
        .iter()
        .map(|e| if let Event::Advance(n) = e { *n } else { 0 })
        .sum();
    assert_eq!(advanced, report.tensor_bytes);
    let items: Vec<&str> = events
        .iter()
        .filter_map(|e| {
            if let Event::Item(n) = e {
                Some(n.as_str())
            } else {
                None
            }
        })
        .collect();
    let names: Vec<&str> = src.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(items, names);
    assert_eq!(events.last(), Some(&Event::Finish));
    // A float source: nothing is requantized, so no warning.
    assert!(
        !events.iter().any(|e| matches!(e, Event::Notice(_))),
        "{events:?}"
    );

    // The same conversion as .mica holds the same tensors.
    let m = scratch("q8").join("q8.mica");
    run(&m, &q8_0()).0.unwrap();
    let m = MicaFile::open(&m).unwrap();
    let gguf = GgufFile::open(&out).unwrap();
    for t in gguf.tensors() {
        let v = m.view();
        let u = v.tensor(&t.name).unwrap();
        assert!(v.tensor_data(u) == gguf.tensor_data(t), "{}", t.name);
    }
}

#[test]
fn a_mix_reports_the_types_it_wrote() {
    let out = scratch("mix").join("mix.gguf");
    let opts = ConvertOptions {
        mix: Some(6.0),
        threads: 2,
        ..ConvertOptions::default()
    };
    let (report, events) = run(&out, &opts);
    let report = report.unwrap();
    let mix = report.mix.as_ref().unwrap();
    let f = GgufFile::open(&out).unwrap();
    assert!(!mix.tensors.is_empty());
    for t in &mix.tensors {
        assert_eq!(f.tensor(&t.name).unwrap().ggml_type, t.ty, "{}", t.name);
    }
    let (bits, n) = f.tensors().iter().fold((0f64, 0f64), |(b, n), t| {
        (b + 8.0 * t.n_bytes as f64, n + t.n_elements() as f64)
    });
    assert_eq!(mix.bpw, bits / n);
    assert!(mix.bpw <= 6.0 && (mix.bpw - report.bits_per_weight()).abs() < 1e-12);
    assert_eq!((mix.measured, mix.unmeasured), (None, 0));
    // Without importance or calibration text: a warning and a note, as notices.
    let notices: Vec<&Notice> = events
        .iter()
        .filter_map(|e| {
            if let Event::Notice(n) = e {
                Some(n)
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        notices,
        vec![&Notice::MixUnweighted, &Notice::MixUncalibrated],
        "{events:?}"
    );
    assert!(notices[0].is_warning() && !notices[1].is_warning());
}

#[test]
fn bad_options_are_typed_errors_and_leave_no_file() {
    let dir = scratch("errors");
    let out = dir.join("x.gguf");
    let with = |f: &dyn Fn(&mut ConvertOptions)| {
        let mut o = q8_0();
        f(&mut o);
        let (r, _) = run(&out, &o);
        assert!(!out.exists());
        r.unwrap_err()
    };
    let e = run(&dir.join("x.txt"), &q8_0()).0.unwrap_err();
    assert!(
        matches!(&e, QuantError::OutputExtension { path } if path.ends_with("x.txt")),
        "{e}"
    );

    let e = with(&|o| o.tensor_types = vec![TensorTypeRule::parse("no_such=q8_0").unwrap()]);
    assert!(
        matches!(&e, QuantError::TensorTypeUnmatched { pattern } if pattern == "no_such"),
        "{e}"
    );

    // 64-wide rows: not whole Q4_K blocks.
    let e = with(&|o| o.tensor_types = vec![TensorTypeRule::parse("attn_v=q4_k").unwrap()]);
    match &e {
        QuantError::TensorTypeBlock {
            tensor,
            ty,
            row_len,
            ..
        } => {
            assert_eq!(
                (tensor.as_str(), *ty, *row_len),
                ("blk.0.attn_v.weight", DType::Q4_K, 64)
            );
        }
        _ => panic!("{e}"),
    }
    assert!(
        e.to_string()
            .contains("not a multiple of Q4_K's block of 256"),
        "{e}"
    );

    let e = with(&|o| {
        o.file_type = None;
        o.importance = Importance::Matrix {
            imatrix: Imatrix::default(),
            name: "m".into(),
        };
    });
    assert!(matches!(e, QuantError::ImportanceNeedsQuantizedType), "{e}");

    let e = with(&|o| {
        o.file_type = None;
        o.mix = Some(1.5);
    });
    assert!(
        matches!(e, QuantError::MixTooSmall { bpw, smallest } if bpw == 1.5 && smallest > 1.5),
        "{e}"
    );
    let e = with(&|o| o.mix = Some(40.0));
    assert!(matches!(e, QuantError::MixBudget { .. }), "{e}");
    let e = with(&|o| {
        o.file_type = Some(FileType::F16);
        o.mix = Some(8.0);
    });
    assert!(matches!(e, QuantError::MixNeedsQuantizedType), "{e}");
}

/// IQ2_XS needs an importance matrix: without one (or without an entry for the tensor) the
/// conversion is refused before anything is written; with one, the tensor holds the kernels'
/// weighted IQ2_XS quantizer's bytes. Grid i-quants mica has no quantizer for are refused.
#[test]
fn iq2_xs_needs_an_importance_matrix_and_other_grid_types_are_refused() {
    use mica_formats::{GgufWriter, MetaValue, ggml_types::GgmlType};
    use mica_kernels::quant::weighted::quantize_row_weighted;
    let dir = scratch("iq2");
    let (rows, cols) = (4usize, 256usize);
    let x: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1009) as f32 / 1009.0 - 0.5)
        .collect();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut w = GgufWriter::new();
    w.meta("general.architecture", MetaValue::String("llama".into()))
        .meta("llama.block_count", MetaValue::U32(8))
        .tensor(
            "blk.3.ffn_down.weight",
            GgmlType(0),
            &[cols as u64, rows as u64],
            &bytes,
        );
    let src = dir.join("src.gguf");
    std::fs::write(&src, w.to_bytes()).unwrap();
    let out = dir.join("iq2.gguf");
    let convert_with = |o: &ConvertOptions| convert(&src, &out, o, &mut |_| {});
    let mut opts = ConvertOptions {
        file_type: Some(FileType::IQ2_XS),
        threads: 2,
        ..ConvertOptions::default()
    };

    let e = convert_with(&opts).unwrap_err();
    assert!(
        matches!(&e, QuantError::ImportanceRequired { tensor, ty }
            if tensor == "blk.3.ffn_down.weight" && *ty == DType::IQ2_XS),
        "{e}"
    );
    assert!(e.to_string().contains("--imatrix"), "{e}");
    assert!(!out.exists());

    let imp: Vec<f32> = (0..cols).map(|c| 1.0 + (c % 5) as f32).collect();
    let mut m = Imatrix::default();
    m.entries
        .insert("blk.9.ffn_down.weight".into(), (imp.clone(), 1.0));
    opts.importance = Importance::Matrix {
        imatrix: m.clone(),
        name: "m".into(),
    };
    let e = convert_with(&opts).unwrap_err();
    assert!(
        matches!(&e, QuantError::ImportanceMissing { row_len: 256, .. }),
        "{e}"
    );
    assert!(!out.exists());

    m.entries
        .insert("blk.3.ffn_down.weight".into(), (imp.clone(), 1.0));
    opts.importance = Importance::Matrix {
        imatrix: m,
        name: "m".into(),
    };
    convert_with(&opts).unwrap();
    let got = GgufFile::open(&out).unwrap();
    let t = got.tensor("blk.3.ffn_down.weight").unwrap();
    assert_eq!(t.dtype(), Some(DType::IQ2_XS));
    let rb = DType::IQ2_XS.row_bytes(cols).unwrap();
    let mut want = vec![0u8; rows * rb];
    for (xr, o) in x.chunks_exact(cols).zip(want.chunks_exact_mut(rb)) {
        quantize_row_weighted(DType::IQ2_XS, xr, &imp, o);
    }
    assert_eq!(got.tensor_data(t), &want[..]);
    std::fs::remove_file(&out).unwrap();

    opts.tensor_types = vec![TensorTypeRule::parse("ffn_down=iq3_s").unwrap()];
    let e = convert_with(&opts).unwrap_err();
    assert!(
        matches!(
            &e,
            QuantError::UnwritableGridType {
                ty: DType::IQ3_S,
                ..
            }
        ),
        "{e}"
    );
    assert!(!out.exists());
}

/// Gemma 4 MoE (`fixtures/converted/gemma4_moe`: llama.cpp's converter output, and that
/// quantized to Q8_0 by llama.cpp's `llama_model_quantize`): mica's Q8_0 conversion writes
/// llama.cpp's file tensor for tensor — the router kept F32, the stacked 3-D experts (fused
/// gate-up, down) quantized row by row, the router and per-expert scales copied — and runs.
#[test]
fn gemma4_moe_q8_0_is_llama_cpps_file() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/converted/gemma4_moe");
    let out = scratch("gemma4_moe").join("q8.gguf");
    convert(&dir.join("model.f32.gguf"), &out, &q8_0(), &mut |_| {}).unwrap();
    let (got, want) = (
        GgufFile::open(&out).unwrap(),
        GgufFile::open(dir.join("model.q8_0.gguf")).unwrap(),
    );
    assert_eq!(got.tensors().len(), want.tensors().len());
    for t in want.tensors() {
        let u = got.tensor(&t.name).unwrap();
        assert_eq!(
            (&u.shape, u.ggml_type),
            (&t.shape, t.ggml_type),
            "{}",
            t.name
        );
        assert!(
            got.tensor_data(u) == want.tensor_data(t),
            "bytes of {}",
            t.name
        );
    }
    let experts = got.tensor("blk.0.ffn_gate_up_exps.weight").unwrap();
    assert_eq!(experts.ggml_type.dtype(), Some(DType::Q8_0));
    assert_eq!(experts.shape.len(), 3);
    mica_models::arch::load_gguf(Arc::new(got)).unwrap();
}
