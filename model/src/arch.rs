//! `general.architecture`, parsed once at load into the architectures Strata runs.

use gguf::GgufFile;

use crate::error::{EngineError, Result};

/// A model architecture (GGUF `general.architecture`). Displays as its GGUF name, which is also
/// the prefix of its metadata keys (`<arch>.block_count`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Gemma3,
    Llama,
    Qwen2,
    Qwen3,
    Qwen3Moe,
    /// Qwen3.8-Flash-Next: its own forward pass (`model::qwen4exp`).
    Qwen4Exp,
}

impl Arch {
    pub const ALL: [Arch; 6] = [Arch::Gemma3, Arch::Llama, Arch::Qwen2, Arch::Qwen3, Arch::Qwen3Moe, Arch::Qwen4Exp];

    /// The GGUF name (`general.architecture` value).
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Gemma3 => "gemma3",
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen4Exp => "qwen4exp",
        }
    }

    pub fn from_gguf_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.gguf_name() == name)
    }

    /// Whether both backends copy llama.cpp's CPU rounding bit for bit for this architecture
    /// (ggml-order matmul kernels, x86 Q8_0 activation rounding, the f16 GELU table, ggml's
    /// rope, RMS norm and attention order). Gemma 3 needs it: its residual stream has
    /// outliers large enough that a one-ulp difference flips a later Q8 activation quant and
    /// moves logits by ~0.1 (measured: our own AVX-512 vs portable kernels differ by
    /// 0.09-0.2 mean |logit| on prompt 1). With it, prompt 1's last logits equal llama.cpp's
    /// exactly. The exact kernels are slower, so other models keep the fast ones (they match
    /// llama.cpp without it).
    pub fn ggml_exact(self) -> bool {
        self == Arch::Gemma3
    }

    /// The architecture of an opened GGUF file; an unknown one is a named error.
    pub fn of(g: &GgufFile, path: &std::path::Path) -> Result<Arch> {
        let name = g.architecture().map_err(|source| EngineError::Gguf { path: path.to_path_buf(), source })?;
        Arch::from_gguf_name(name).ok_or_else(|| EngineError::UnsupportedArch(name.to_string()))
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.gguf_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for a in Arch::ALL {
            assert_eq!(Arch::from_gguf_name(a.gguf_name()), Some(a));
        }
        assert_eq!(Arch::from_gguf_name("mamba"), None);
    }
}
