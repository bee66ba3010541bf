//! Every kernel module compiles to PTX with NVRTC, for the architectures mica targets, and
//! declares exactly the kernels the crate loads from it. Needs NVRTC (no GPU): `scripts/test`
//! installs it with `scripts/fetch-nvrtc` and puts it on `LD_LIBRARY_PATH`.

use mica_cuda::kernels::{MODULES, Module, compile, ptx_entries};

fn need_nvrtc() {
    assert!(
        mica_cuda::nvrtc_present(),
        "NVRTC (libnvrtc.so.12) cannot be opened: run `scripts/fetch-nvrtc` and put the folder \
         it prints on LD_LIBRARY_PATH (scripts/test does both)"
    );
}

#[test]
fn every_module_compiles_for_ampere_and_hopper() {
    need_nvrtc();
    for m in MODULES {
        for arch in ["compute_80", "compute_90"] {
            let ptx = compile(m, arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            let mut got = ptx_entries(&ptx);
            let mut want = m.kernels();
            got.sort();
            want.sort();
            assert_eq!(got, want, "module {} for {arch}", m.name);
        }
    }
}

#[test]
fn a_kernel_that_does_not_compile_is_reported_with_its_file_and_line() {
    need_nvrtc();
    // A module whose prelude is fine and whose kernel misspells a variable.
    let m = Module {
        name: "matvec",
        files: &["dequant.cu", "matvec.cu"],
    };
    let mut src = m.source();
    src.push_str("#line 1 \"broken.cu\"\nKERNEL broken(int n) { undeclared = n; }\n");
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec!["--gpu-architecture=compute_90".into()],
        ..Default::default()
    };
    let err = cudarc::nvrtc::compile_ptx_with_opts(src, opts).unwrap_err();
    let text = format!("{err:?}");
    assert!(text.contains("broken.cu(1)"), "{text}");
    assert!(text.contains("undeclared"), "{text}");
}
