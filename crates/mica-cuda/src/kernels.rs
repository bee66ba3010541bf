//! The kernel sources and their modules, and their compilation to PTX by NVRTC.

use crate::{GpuError, Result};
use mica_kernels::DType;

/// Every source file, by name (`kernels/`).
pub const FILES: &[(&str, &str)] = &[
    ("prelude.cuh", include_str!("../kernels/prelude.cuh")),
    ("dequant.cu", include_str!("../kernels/dequant.cu")),
    ("matvec.cu", include_str!("../kernels/matvec.cu")),
    ("elementwise.cu", include_str!("../kernels/elementwise.cu")),
    ("attention.cu", include_str!("../kernels/attention.cu")),
];

/// The weight formats with kernels, with the name their kernels carry (`matvec_q4_k`...).
pub const FORMATS: &[(DType, &str)] = &[
    (DType::F32, "f32"),
    (DType::F16, "f16"),
    (DType::BF16, "bf16"),
    (DType::Q4_0, "q4_0"),
    (DType::Q8_0, "q8_0"),
    (DType::Q4_K, "q4_k"),
    (DType::Q6_K, "q6_k"),
];

/// The kernel-name suffix of `dtype`, when it has kernels.
pub fn format_name(dtype: DType) -> Option<&'static str> {
    FORMATS.iter().find(|(d, _)| *d == dtype).map(|(_, n)| *n)
}

/// One compilation unit: its files, in order (after `prelude.cuh`).
#[derive(Clone, Copy, Debug)]
pub struct Module {
    pub name: &'static str,
    pub files: &'static [&'static str],
}

pub const MODULES: &[Module] = &[
    Module {
        name: "matvec",
        files: &["dequant.cu", "matvec.cu"],
    },
    Module {
        name: "elementwise",
        files: &["elementwise.cu"],
    },
    Module {
        name: "attention",
        files: &["attention.cu"],
    },
];

impl Module {
    /// The kernels the module defines (its PTX's entry points).
    pub fn kernels(&self) -> Vec<String> {
        match self.name {
            "matvec" => FORMATS
                .iter()
                .flat_map(|(_, n)| [format!("matvec_{n}"), format!("get_rows_{n}")])
                .collect(),
            "elementwise" => ["rms_norm", "rope", "glu", "axpy", "scale", "copy", "bias"]
                .map(String::from)
                .to_vec(),
            "attention" => ["kv_write", "attention"].map(String::from).to_vec(),
            other => unreachable!("module {other}"),
        }
    }

    /// The module's source: the prelude, then its files, each under a `#line` naming it (so
    /// NVRTC's messages point into `kernels/`).
    pub fn source(&self) -> String {
        let mut s = String::new();
        for name in std::iter::once(&"prelude.cuh").chain(self.files) {
            let text = FILES
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, t)| *t)
                .unwrap_or_else(|| panic!("kernel file {name} is not in FILES"));
            s.push_str(&format!("#line 1 \"{name}\"\n{text}\n"));
        }
        s
    }
}

/// Every kernel of every module.
pub fn all_kernels() -> Vec<String> {
    MODULES.iter().flat_map(Module::kernels).collect()
}

/// `module` compiled to PTX for `arch` (a virtual architecture, `compute_90`), by NVRTC.
pub fn compile(module: &Module, arch: &str) -> Result<String> {
    if !crate::nvrtc_present() {
        return Err(GpuError::NoNvrtc);
    }
    let opts = cudarc::nvrtc::CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        name: Some(format!("{}.cu", module.name)),
        ..Default::default()
    };
    match cudarc::nvrtc::compile_ptx_with_opts(module.source(), opts) {
        Ok(ptx) => Ok(ptx.to_src()),
        Err(cudarc::nvrtc::CompileError::CompileError { log, .. }) => Err(GpuError::Compile {
            module: module.name.into(),
            log: log.to_string_lossy().into_owned(),
        }),
        Err(e) => Err(GpuError::Compile {
            module: module.name.into(),
            log: format!("{e:?}"),
        }),
    }
}

/// The entry points (`.entry NAME(`) a PTX text declares.
pub fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| {
            let rest = l.trim_start().strip_prefix(".visible .entry ")?;
            Some(rest.split('(').next()?.trim().to_string())
        })
        .collect()
}
