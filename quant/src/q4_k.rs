//! Q4_K: 256 weights per super-block in 8 sub-blocks of 32; `x = d*sc_j * q - dmin*m_j` with
//! 4-bit `q` and 6-bit sub-block scales `sc_j` and mins `m_j`. Pairs with Q8_K.
//!
//! Layout (144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (8 scales + 8 mins, 6 bits
//! each, packed as in [`get_scale_min_k4`]), `qs: [u8; 128]`: for chunk `c` of 64 weights,
//! weight `64c + l` is the low nibble of `qs[32c + l]` and `64c + 32 + l` the high nibble.

use crate::block::impl_block;
use crate::half::{f16_to_f32, f32_to_f16};
use crate::q8_k::BlockQ8K;
use crate::util::{fabsf, make_qkx2_quants, nearest_int, sqrtf};
use crate::{GgmlType, QK_K};

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockQ4K {
    /// Super-block scale of the sub-block scales (f16 bits).
    pub d: u16,
    /// Super-block scale of the sub-block mins (f16 bits).
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
impl_block!(BlockQ4K, GgmlType::Q4K, QK_K);

/// Scale and min (6 bits each) of sub-block `j` (0..8) of Q4_K/Q5_K.
///
/// Packing: bytes 0..4 hold scales 0..3 in their low 6 bits, bytes 4..8 mins 0..3; scales and
/// mins 4..7 have their low 4 bits in the nibbles of bytes 8..12 and their top 2 bits in the
/// spare top bits of bytes 0..4 (scales) and 4..8 (mins).
#[inline(always)]
pub fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    let j = j & 7;
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Pack 8 scales and 8 mins (each < 64) into the 12-byte Q4_K/Q5_K layout.
pub fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// `dequantize_row_q4_K` for one block.
pub fn dequantize_ref(b: &BlockQ4K, y: &mut [f32; QK_K]) {
    let d = f16_to_f32(b.d);
    let min = f16_to_f32(b.dmin);
    for c in 0..4 {
        let (sc1, m1) = get_scale_min_k4(2 * c, &b.scales);
        let (sc2, m2) = get_scale_min_k4(2 * c + 1, &b.scales);
        let (d1, m1) = (d * sc1 as f32, min * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, min * m2 as f32);
        for l in 0..32 {
            let q = b.qs[32 * c + l];
            y[64 * c + l] = d1 * (q & 0xf) as f32 - m1;
            y[64 * c + 32 + l] = d2 * (q >> 4) as f32 - m2;
        }
    }
}

/// Per-sub-block weights of the K-quant reference quantizers: `sqrt(mean(x²)) + |x|`.
pub(crate) fn kquant_weights(x: &[f32], w: &mut [f32; 32]) {
    let mut sum_x2 = 0.0f32;
    for &v in x {
        sum_x2 += v * v;
    }
    let av_x = sqrtf(sum_x2 / 32.0);
    for (o, &v) in w.iter_mut().zip(x.iter()) {
        *o = av_x + fabsf(v);
    }
}

/// Shared body of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`: fit each sub-block with
/// `make_qkx2_quants`, quantize the 8 scales and mins to 6 bits against their maxima, then
/// requantize every weight with the final (f16-rounded) scales. Returns `(d, dmin, scales, L)`.
pub(crate) fn quantize_k4_common(
    x: &[f32; QK_K],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> (u16, u16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    let mut w = [0.0f32; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        kquant_weights(xs, &mut w);
        let (s, m) = make_qkx2_quants(nmax, xs, &w, &mut l[32 * j..32 * j + 32], rmin, rdelta, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    for j in 0..8 {
        // C stores nearest_int into a uint8_t (wrapping) before MIN(63, .).
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    let sc = pack_scale_min_k4(&ls, &lm);
    let d = f32_to_f16(max_scale / 63.0);
    let dmin = f32_to_f16(max_min / 63.0);
    for j in 0..8 {
        let (s, m) = get_scale_min_k4(j, &sc);
        let dd = f16_to_f32(d) * s as f32;
        if dd == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for ii in 0..32 {
            let q = nearest_int((x[32 * j + ii] + dm) / dd);
            l[32 * j + ii] = q.clamp(0, nmax) as u8;
        }
    }
    (d, dmin, sc, l)
}

/// `quantize_row_q4_K_ref` for one block.
pub fn quantize_ref(x: &[f32; QK_K]) -> BlockQ4K {
    let (d, dmin, scales, l) = quantize_k4_common(x, 15, -1.0, 0.1, 20);
    let mut qs = [0u8; QK_K / 2];
    for c in 0..4 {
        for i in 0..32 {
            qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
        }
    }
    BlockQ4K { d, dmin, scales, qs }
}

/// The K-quant dot kernel shared by Q4_K and Q5_K once the quants are unpacked to `q`
/// (0..=31): `d*da * Σ_j sc_j Σ q·a  −  dmin*da * Σ_k bsums_k · m_{k/2}`; all sums integer.
pub(crate) fn dot_k4_unpacked(d: u16, dmin: u16, scales: &[u8; 12], q: &[u8; QK_K], a: &BlockQ8K) -> f32 {
    let mut isum = 0i32;
    let mut msum = 0i32;
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let mut s = 0i32;
        for i in 32 * j..32 * j + 32 {
            s += q[i] as i32 * a.qs[i] as i32;
        }
        isum += sc as i32 * s;
        msum += m as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
    }
    let dd = f16_to_f32(d) * a.d();
    let dm = f16_to_f32(dmin) * a.d();
    dd * isum as f32 - dm * msum as f32
}

/// `ggml_vec_dot_q4_K_q8_K` (generic) for one block pair; the min term uses the Q8_K bsums.
pub fn vec_dot_ref(w: &BlockQ4K, a: &BlockQ8K) -> f32 {
    let mut q = [0u8; QK_K];
    for c in 0..4 {
        for l in 0..32 {
            q[64 * c + l] = w.qs[32 * c + l] & 0xf;
            q[64 * c + 32 + l] = w.qs[32 * c + l] >> 4;
        }
    }
    dot_k4_unpacked(w.d, w.dmin, &w.scales, &q, a)
}
