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

/// Quantizes one cache row (one KV head of one cell) to int8: `d = amax / 127`, `q =
/// clamp(round(x / d), -127, 127)` (computed as `x * (1 / d)`; 0 when the row is all zeros);
/// returns `d`. The only definition of the int8 cache format: the decoders' `KvLayer`, the QSA
/// caches and the device's `kv_store_i8` write exactly these bytes.
pub fn quantize_row_i8(src: &[f32], dst: &mut [i8]) -> f32 {
    let amax = src.iter().fold(0f32, |m, x| m.max(x.abs()));
    let d = amax / 127.0;
    let id = if d > 0.0 { 1.0 / d } else { 0.0 };
    for (o, x) in dst.iter_mut().zip(src) {
        *o = (x * id).round().clamp(-127.0, 127.0) as i8;
    }
    d
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
