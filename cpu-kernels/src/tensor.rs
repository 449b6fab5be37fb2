//! The crate's plain types, shared by every other module: the weight matrix [`QTensor`], the
//! error type, the kernel [`Path`] (with its selection, [`best_path`]) and the row-range kernel
//! signature [`RowsFn`] the dispatchers hand out. Depends only on `quant` and the CPU feature
//! detection in `x86::cpu`, never on a kernel.

use crate::acts::Acts;
use quant::GgmlType;

/// A weight matrix as stored in GGUF: `rows` rows of `cols` elements (cols = K, the row length,
/// ggml's `ne[0]`), each row `ty.row_bytes(cols)` bytes, rows contiguous.
#[derive(Clone, Copy, Debug)]
pub struct QTensor<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> QTensor<'a> {
    /// Validated constructor (same checks the kernels do).
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self, KernelError> {
        let t = QTensor { ty, data, rows, cols };
        t.validate()?;
        Ok(t)
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> Result<usize, KernelError> {
        self.ty.row_bytes(self.cols).ok_or(KernelError::Shape {
            what: "weight cols (not a multiple of the block size)",
            expected: self.ty.block_size(),
            got: self.cols,
        })
    }

    pub(crate) fn validate(&self) -> Result<usize, KernelError> {
        if !kernel_supported(self.ty) {
            return Err(KernelError::Unsupported(self.ty));
        }
        let rb = self.row_bytes()?;
        let need = rb * self.rows;
        if self.data.len() < need {
            return Err(KernelError::Shape { what: "weight data bytes", expected: need, got: self.data.len() });
        }
        Ok(rb)
    }
}

/// Errors of the kernel entry points.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    #[error("bad shape: {what}: expected {expected}, got {got}")]
    Shape { what: &'static str, expected: usize, got: usize },
    #[error("weight type {0:?} has no CPU kernel")]
    Unsupported(GgmlType),
    #[error("kernel path {0:?} is not available on this CPU")]
    PathUnavailable(Path),
    #[error("quant: {0:?}")]
    Quant(quant::QuantError),
}

impl From<quant::QuantError> for KernelError {
    fn from(e: quant::QuantError) -> Self {
        KernelError::Quant(e)
    }
}

/// Weight types with matvec/matmul kernels.
pub const SUPPORTED_TYPES: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::IQ3XXS,
    GgmlType::IQ4NL,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::IQ4XS,
    GgmlType::IQ3S,
    GgmlType::IQ2XXS,
    GgmlType::IQ2XS,
    GgmlType::IQ2S,
    GgmlType::IQ1S,
    GgmlType::IQ1M,
];

pub(crate) fn kernel_supported(ty: GgmlType) -> bool {
    SUPPORTED_TYPES.contains(&ty)
}

/// How prompt-sized products (16 or more activation columns) of Q8_0 / Q5_0 / Q4_0 / IQ4_NL /
/// Q4_1 / Q4_K / Q6_K weights, and Q4_1's products of any size, sum their blocks on AVX-512;
/// other types, other paths and fewer columns are the same under both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Gemm {
    /// Lane order: each i32 lane's 4-product partial sum is converted and scaled on its own,
    /// like llama.cpp's kernels, so greedy output follows llama.cpp's token for token.
    #[default]
    Lanes,
    /// Row tiles (`x86::gemm_q0`, `x86::gemm_k`, and `x86::gemv_tiles` for Q4_1's decode):
    /// each (sub-)block summed exactly in integers, one rounding per block. Up to 3x faster;
    /// logits differ from `Lanes` in the last bits.
    Tiles,
}

/// One implementation of the dot-product kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Path {
    /// `quant`'s scalar reference `vec_dot`, row by row (any CPU).
    Portable,
    /// AVX2 + FMA + F16C + BMI2.
    Avx2,
    /// AVX-512 F/BW/VL/VNNI (+ VBMI, BITALG for IQ3_XXS; falls back to the AVX2 IQ3 kernel
    /// without them).
    Avx512,
}

impl Path {
    /// Whether this CPU can run the path.
    pub fn available(self) -> bool {
        match self {
            Path::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Path::Avx2 => crate::x86::cpu::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            Path::Avx512 => crate::x86::cpu::has_avx512(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// All paths this CPU can run, slowest first.
    pub fn all_available() -> Vec<Path> {
        [Path::Portable, Path::Avx2, Path::Avx512].into_iter().filter(|p| p.available()).collect()
    }
}

/// The fastest available path (detected once).
pub fn best_path() -> Path {
    use std::sync::OnceLock;
    static BEST: OnceLock<Path> = OnceLock::new();
    *BEST.get_or_init(|| {
        if std::env::var("STRATA_CPU_PATH").as_deref() == Ok("portable") {
            return Path::Portable;
        }
        if std::env::var("STRATA_CPU_PATH").as_deref() == Ok("avx2") && Path::Avx2.available() {
            return Path::Avx2;
        }
        if Path::Avx512.available() {
            Path::Avx512
        } else if Path::Avx2.available() {
            Path::Avx2
        } else {
            Path::Portable
        }
    })
}

/// Name of the kernel family in use: "avx512vnni", "avx2" or "portable".
/// `STRATA_CPU_PATH=avx2|portable` forces a slower path (for comparisons).
pub fn cpu_features() -> &'static str {
    match best_path() {
        Path::Avx512 => "avx512vnni",
        Path::Avx2 => "avx2",
        Path::Portable => "portable",
    }
}

/// Row-range kernel: computes `y[c * rows + r]` for `r in r0..r1`, `c in 0..acts.n`.
///
/// # Safety
/// `y` must be valid for writes of `acts.n * w.rows` f32 and no other thread may write the
/// same (column, row) cells concurrently; `w` must have been validated (`rb` its row bytes) and
/// the path's CPU features must be present.
pub(crate) type RowsFn = unsafe fn(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32);
