//! The KV cache's storage type: one setting (`--kv`) for every architecture's attention
//! caches, the decoders' and Flash-Next's QSA caches alike, and [`KvRows`], the one host
//! storage of a cache tensor in that type (the CPU's `strata::kv_cache::KvLayer` and the QSA
//! caches both hold their rows in it; the GPU keeps device buffers in the same layout).

/// Storage format of the attention KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
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
    pub const ALL: [KvType; 3] = [KvType::F16, KvType::Int8, KvType::F32];

    /// The name of the type (`--kv`, the config file, the load line).
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::Int8 => "int8",
            KvType::F32 => "f32",
        }
    }

    /// Bytes `values` cached values take in rows of `row` (int8: one f32 scale a row), for
    /// memory plans; None on overflow.
    pub fn bytes_for(self, values: usize, row: usize) -> Option<u64> {
        let values = values as u64;
        match self {
            KvType::F16 => values.checked_mul(2),
            KvType::F32 => values.checked_mul(4),
            KvType::Int8 => values.checked_add(values.div_ceil(row.max(1) as u64).checked_mul(4)?),
        }
    }

    /// Bytes one cached value takes (int8's per-row scale left out), for byte budgets.
    pub fn bytes_per_value(self) -> f64 {
        match self {
            KvType::F16 => 2.0,
            KvType::Int8 => 1.0,
            KvType::F32 => 4.0,
        }
    }
}

/// The values of one cache tensor (K, V, or QSA's indexer keys) as stored, for every
/// architecture and the CPU backend alike: f32, or f16 (llama.cpp's `type_k`/`type_v` = f16,
/// the default), or the engine's int8 rows (`--kv int8`) with one scale per row of `row`
/// values (one KV head of one cell). Flash-Next's QSA caches grow it a cell at a time
/// ([`KvRows::push`]); the decoders' `KvLayer` preallocates its capacity ([`KvRows::zeroed`])
/// and overwrites rows in place ([`KvRows::write`]).
#[derive(Clone, Debug, PartialEq)]
pub enum KvRows {
    F32(Vec<f32>),
    /// IEEE half bits (values rounded to nearest-even on insertion).
    F16(Vec<u16>),
    /// Rows of `row` values (one KV head of one cell) as int8 with one f32 scale each
    /// ([`quantize_row_i8`]); a value reads back as `q · scale`.
    Int8 {
        q: Vec<i8>,
        scale: Vec<f32>,
        row: usize,
    },
}

impl KvRows {
    /// An empty buffer of type `kv` whose int8 rows are `row` values long.
    pub fn new(kv: KvType, row: usize) -> KvRows {
        KvRows::zeroed(kv, 0, row)
    }

    /// `values` zeros of type `kv` (int8: in rows of `row` values, scales 0).
    pub fn zeroed(kv: KvType, values: usize, row: usize) -> KvRows {
        KvRows::try_zeroed(kv, values, row).unwrap_or_else(|e| panic!("KV rows of {values} values: {e}"))
    }

    /// [`KvRows::zeroed`], with memory that cannot be allocated as an error instead of an
    /// abort: a context length comes from a flag or a file. The zeros come from the allocator
    /// (calloc), so pages are touched only as the cache fills, as with `vec![0; n]`.
    pub fn try_zeroed(kv: KvType, values: usize, row: usize) -> Result<KvRows, String> {
        let row = row.max(1);
        Ok(match kv {
            KvType::F16 => KvRows::F16(zeros(values)?),
            KvType::F32 => KvRows::F32(zeros(values)?),
            KvType::Int8 => KvRows::Int8 { q: zeros(values)?, scale: zeros(values.div_ceil(row))?, row },
        })
    }

    /// Overwrites the values at `start..start + vals.len()` (whole int8 rows) in place.
    pub fn write(&mut self, start: usize, vals: &[f32]) {
        let end = start + vals.len();
        match self {
            KvRows::F32(v) => v[start..end].copy_from_slice(vals),
            KvRows::F16(v) => {
                for (o, &x) in v[start..end].iter_mut().zip(vals) {
                    *o = quant::f32_to_f16(x);
                }
            }
            KvRows::Int8 { q, scale, row } => {
                debug_assert!(
                    start.is_multiple_of(*row) && vals.len().is_multiple_of(*row),
                    "int8 cache rows are {row} values"
                );
                for (i, r) in vals.chunks(*row).enumerate() {
                    let at = start + i * *row;
                    scale[at / *row] = quantize_row_i8(r, &mut q[at..at + r.len()]);
                }
            }
        }
    }

    /// Bytes held (int8: quants and scales).
    pub fn bytes(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len() * 4,
            KvRows::F16(v) => v.len() * 2,
            KvRows::Int8 { q, scale, .. } => q.len() + scale.len() * 4,
        }
    }

    /// Stored values.
    pub fn len(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::F16(v) => v.len(),
            KvRows::Int8 { q, .. } => q.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends `vals` (whole rows for int8): grows by that many zeros, then [`Self::write`]s
    /// them, so appended and overwritten rows are encoded by the same code.
    pub fn push(&mut self, vals: &[f32]) {
        let at = self.len();
        match self {
            KvRows::F32(v) => v.resize(at + vals.len(), 0.0),
            KvRows::F16(v) => v.resize(at + vals.len(), 0),
            KvRows::Int8 { q, scale, row } => {
                q.resize(at + vals.len(), 0);
                scale.resize((at + vals.len()).div_ceil(*row), 0.0);
            }
        }
        self.write(at, vals);
    }

    /// Keeps the first `n` values (whole rows for int8).
    pub fn truncate(&mut self, n: usize) {
        match self {
            KvRows::F32(v) => v.truncate(n),
            KvRows::F16(v) => v.truncate(n),
            KvRows::Int8 { q, scale, row } => {
                q.truncate(n);
                scale.truncate(n / *row);
            }
        }
    }

    /// Values `start..start + out.len()` as f32 (exact for f16; `q · scale` for int8).
    pub fn read(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            KvRows::F32(v) => out.copy_from_slice(&v[start..end]),
            KvRows::F16(v) => {
                for (o, &h) in out.iter_mut().zip(&v[start..end]) {
                    *o = quant::f16_to_f32(h);
                }
            }
            KvRows::Int8 { q, scale, row } => {
                for (i, (o, &x)) in out.iter_mut().zip(&q[start..end]).enumerate() {
                    *o = x as f32 * scale[(start + i) / *row];
                }
            }
        }
    }
}

/// Element types whose all-zero bytes are the value 0 (what `alloc_zeroed` returns).
trait ZeroBits: Copy {}
impl ZeroBits for u16 {}
impl ZeroBits for f32 {}
impl ZeroBits for i8 {}

/// `n` zeros from the allocator's zeroed memory, or an error naming the size when it cannot be
/// had (the fallible `vec![0; n]`).
fn zeros<T: ZeroBits>(n: usize) -> Result<Vec<T>, String> {
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| format!("{n} values overflow the address space"))?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if p.is_null() {
        return Err(format!("{} bytes could not be allocated", layout.size()));
    }
    // SAFETY: `p` comes from the global allocator with the layout of `n` values of `T`, and all
    // of them are initialised: zero bytes are a valid `T` (`ZeroBits`).
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for KvType {
    type Err = String;
    fn from_str(s: &str) -> Result<KvType, String> {
        KvType::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| format!("unknown KV cache type {s:?} (f16, int8 or f32)"))
    }
}
