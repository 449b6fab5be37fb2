//! Kernels, one file per op family. Entry points are `#[unsafe(no_mangle)] extern "gpu-kernel"`
//! functions generated from the lists in `gpu-abi`; each turns its raw arguments into the
//! generic implementation in one place.
pub mod attention;
pub mod dequant;
pub mod fwd;
pub mod gdn;
pub mod gr;
pub mod mmq;
pub mod mmvq;
mod mmvq_blocks;
pub mod ordered;
pub mod ple;
pub mod qsa;
pub mod quantize;
pub mod reduce;

/// The scale of ggml's rms_norm over `n` values `x(0..n)` for one wave's row: lane 0 sums the
/// f32-rounded squares in one f64 chain (`cpu_kernels::rms_norm_ggml`'s order), every lane gets
/// `1 / sqrtf(mean + eps)` (correctly rounded). Lane 0 reads the row itself, so the values may
/// come from anywhere (a strided row, a mean computed on the fly). Call in wave-uniform flow.
#[inline(always)]
pub(crate) fn rms_scale_ggml(x: impl Fn(u32) -> f32, n: u32, eps: f32) -> f32 {
    let mut s = 0f64;
    if crate::arch::lane_id() == 0 {
        for i in 0..n {
            let v = x(i);
            s += (v * v) as f64;
        }
    }
    1.0 / quant::util::sqrtf((crate::arch::read_lane_f64(s, 0) / n as f64) as f32 + eps)
}

/// Calls `f(0), .., f(N-1)` as straight-line code. After inlining every index is a constant,
/// so arrays indexed by it stay in registers; a plain `for` loop that LLVM chooses not to
/// unroll (large bodies, NC > 4) would index them at run time and put them on the stack.
#[inline(always)]
pub(crate) fn unroll<const N: usize>(mut f: impl FnMut(usize)) {
    const { assert!(N <= 8) };
    if N > 0 {
        f(0)
    }
    if N > 1 {
        f(1)
    }
    if N > 2 {
        f(2)
    }
    if N > 3 {
        f(3)
    }
    if N > 4 {
        f(4)
    }
    if N > 5 {
        f(5)
    }
    if N > 6 {
        f(6)
    }
    if N > 7 {
        f(7)
    }
}
