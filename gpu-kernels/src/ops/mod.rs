//! Kernels, one file per op family. Entry points are `#[unsafe(no_mangle)] extern "gpu-kernel"`
//! functions generated from the lists in `abi.rs`; each turns its raw arguments into the
//! generic implementation in one place.
pub mod attention;
pub mod dequant;
pub mod fwd;
pub mod gdn;
pub mod gr;
pub mod mmq;
pub mod mmvq;
pub mod ordered;
pub mod ple;
pub mod qsa;
mod mmvq_blocks;
pub mod quantize;
pub mod reduce;

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
