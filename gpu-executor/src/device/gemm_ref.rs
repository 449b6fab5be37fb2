//! Host implementation of the strided-batched GEMM ([`super::Gemm`]): what hipBLAS does on a
//! real card, the emulator backend does here. Column-major like BLAS; products accumulated in
//! f32 in `l` order (f16 compute also accumulates in f32, then rounds once, which is at least
//! as accurate as hipBLAS's f16 compute).
use super::{ComputeType, DType, Gemm, Transpose};

fn load(ty: DType, bytes: &[u8], i: usize) -> f32 {
    match ty {
        DType::F32 => f32::from_le_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]),
        DType::F16 => quant::f16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
        DType::BF16 => quant::bf16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])),
    }
}

fn store(ty: DType, bytes: &mut [u8], i: usize, v: f32) {
    match ty {
        DType::F32 => bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => bytes[2 * i..2 * i + 2].copy_from_slice(&quant::f32_to_f16(v).to_le_bytes()),
        DType::BF16 => bytes[2 * i..2 * i + 2].copy_from_slice(&quant::f32_to_bf16(v).to_le_bytes()),
    }
}

/// Runs `g` on host copies of the operands: `a`, `b` and `c` hold at least
/// [`Gemm::extents`] elements of their types (the caller checked `g.validate()` and sizes).
/// `beta == 0` ignores the old contents of C (NaN included), as BLAS does.
pub fn gemm_host(g: &Gemm, a: &[u8], b: &[u8], c: &mut [u8]) {
    for batch in 0..g.batch {
        for j in 0..g.n {
            for i in 0..g.m {
                gemm_elem(g, a, b, c, batch, i, j);
            }
        }
    }
}

/// The same GEMM visiting C in tiles of `tile_m` × `tile_n` elements (rows inner): the
/// software device's stand-ins for hipBLASLt algorithms. Every element is computed by the
/// same function in the same `l` order, so all blockings give results identical to
/// [`gemm_host`] bit for bit; only the memory access order (and so host speed) differs.
pub fn gemm_host_tiled(g: &Gemm, a: &[u8], b: &[u8], c: &mut [u8], tile_m: usize, tile_n: usize) {
    let (tm, tn) = (tile_m.max(1), tile_n.max(1));
    for batch in 0..g.batch {
        for j0 in (0..g.n).step_by(tn) {
            for i0 in (0..g.m).step_by(tm) {
                for j in j0..(j0 + tn).min(g.n) {
                    for i in i0..(i0 + tm).min(g.m) {
                        gemm_elem(g, a, b, c, batch, i, j);
                    }
                }
            }
        }
    }
}

/// `C[i, j]` of batch `batch`.
#[inline]
fn gemm_elem(g: &Gemm, a: &[u8], b: &[u8], c: &mut [u8], batch: usize, i: usize, j: usize) {
    let (oa, ob, oc) = (batch * g.stride_a, batch * g.stride_b, batch * g.stride_c);
    let mut acc = 0f32;
    for l in 0..g.k {
        let ai = oa + if g.trans_a == Transpose::N { i + l * g.lda } else { l + i * g.lda };
        let bi = ob + if g.trans_b == Transpose::N { l + j * g.ldb } else { j + l * g.ldb };
        acc += load(g.a_type, a, ai) * load(g.b_type, b, bi);
    }
    let ci = oc + i + j * g.ldc;
    let mut v = g.alpha * acc;
    if g.beta != 0.0 {
        v += g.beta * load(g.c_type, c, ci);
    }
    if g.compute == ComputeType::F16 {
        v = quant::f16_to_f32(quant::f32_to_f16(v));
    }
    store(g.c_type, c, ci, v);
}
