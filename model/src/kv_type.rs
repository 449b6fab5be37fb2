//! The KV cache's storage type: one setting (`--kv`) for every architecture's attention
//! caches, the decoders' and Flash-Next's QSA caches alike. The storage itself is the
//! backends' (`strata::kv_cache` on the CPU, device buffers on the GPU).

/// Storage format of the attention KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KvType {
    /// IEEE half precision (llama.cpp's default).
    #[default]
    F16,
    /// Symmetric int8 with one f32 scale per (position, KV head) row.
    Int8,
    /// f32, exact (twice f16's memory; the CPU backend only).
    F32,
}

impl KvType {
    /// Bytes one cached value takes (int8's per-row scale left out), for byte budgets.
    pub fn bytes_per_value(self) -> f64 {
        match self {
            KvType::F16 => 2.0,
            KvType::Int8 => 1.0,
            KvType::F32 => 4.0,
        }
    }
}
