//! The lattice grids of the IQ formats. They are format data (a file's indices point into
//! them), generated from gguf-py's packed copies by `scripts/make-quant-grids.py`; grid point
//! `i` holds element `j` in byte `j` (little-endian), as ggml stores them.

mod iq1s;
mod iq2;
mod iq3s;

pub use iq1s::IQ1S_GRID;
pub use iq2::{IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID};
pub use iq3s::IQ3S_GRID;

/// `-1.0` if bit `j` of the sign byte is set, else `1.0` (ggml's `kmask_iq2xs` test).
#[inline(always)]
pub fn sign_f(signs: u8, j: usize) -> f32 {
    if signs & (1 << (j & 7)) != 0 { -1.0 } else { 1.0 }
}

/// `-p` if bit `j` of the sign byte is set, else `p`.
#[inline(always)]
pub fn signed(signs: u8, j: usize, p: i32) -> i32 {
    if signs & (1 << (j & 7)) != 0 { -p } else { p }
}
