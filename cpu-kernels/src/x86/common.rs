//! Plain helpers shared by the x86 kernel files (no kernels, no dispatch): cache blocking,
//! K-quant scale unpacking, the `hsum_float_8` reduction.

/// Activation columns per cache block in matmul: about 192 KiB of activations (e.g. 48
/// columns at K = 4096), comfortably inside Zen 4's 1 MiB L2 while the weight row stays in L1.
#[inline]
pub(crate) fn col_block(k: usize, act_elem_bytes: usize) -> usize {
    ((192 << 10) / (k * act_elem_bytes).max(1)).clamp(4, 64) & !3
}

/// Q4_K / Q5_K 6-bit scales and mins packed in 12 bytes (ggml `get_scale_min_k4`), as two
/// little-endian u64 of 8 bytes each (scales, mins), computed with 32-bit word operations:
/// j < 4: sc = s[j] & 63, m = s[j+4] & 63; j >= 4: the low 4 bits come from s[j+4] (low /
/// high nibble), the top 2 bits from the top 2 bits of s[j-4] / s[j].
#[inline(always)]
pub(crate) fn k4_scales_u64(s: &[u8; 12]) -> (u64, u64) {
    let a = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let b = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let c = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let sc_lo = a & 0x3f3f_3f3f;
    let mn_lo = b & 0x3f3f_3f3f;
    let sc_hi = (c & 0x0f0f_0f0f) | ((a >> 2) & 0x3030_3030);
    let mn_hi = ((c >> 4) & 0x0f0f_0f0f) | ((b >> 2) & 0x3030_3030);
    ((sc_lo as u64) | ((sc_hi as u64) << 32), (mn_lo as u64) | ((mn_hi as u64) << 32))
}

/// Q4_K / Q5_K 6-bit scales and mins packed in 12 bytes (ggml `get_scale_min_k4`).
#[inline(always)]
pub(crate) fn k4_scales(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let (sc, mn) = k4_scales_u64(s);
    (sc.to_le_bytes(), mn.to_le_bytes())
}

/// Q3_K's 16 signed scales (`quant::q3_k::scales`) four at a time in u32 lanes: the low 4 bits
/// are the nibbles of bytes 0..8, the top 2 bits the bit pairs of bytes 8..12.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8; 12]) -> [i8; 16] {
    let a = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    let b = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
    let c = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
    let (lo, hi) = (0x0f0f_0f0f, 0x0303_0303);
    let w = [
        (a & lo) | ((c & hi) << 4),
        (b & lo) | (((c >> 2) & hi) << 4),
        ((a >> 4) & lo) | (((c >> 4) & hi) << 4),
        ((b >> 4) & lo) | (((c >> 6) & hi) << 4),
    ];
    let mut out = [0i8; 16];
    for (o, v) in out.chunks_exact_mut(4).zip(w) {
        for (o, b) in o.iter_mut().zip(v.to_le_bytes()) {
            *o = b as i8 - 32; // b < 64
        }
    }
    out
}

/// ggml's `hsum_float_8` order: lanes (0+4, 1+5, 2+6, 3+7), then (0+2) + (1+3).
#[inline]
pub(crate) fn hsum8(l: &[f32; 8]) -> f32 {
    let r = [l[0] + l[4], l[1] + l[5], l[2] + l[6], l[3] + l[7]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// Rows of `rb` bytes ahead the decode (one-column) kernels prefetch: about 2 KiB.
pub(crate) fn pf_rows(rb: usize) -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let bytes = *N.get_or_init(|| std::env::var("STRATA_PF_BYTES").ok().and_then(|v| v.parse().ok()).unwrap_or(2048));
    bytes.div_ceil(rb.max(1)).max(1)
}

/// Software prefetch in the decode kernels (`STRATA_NO_PF` turns it off, for comparisons).
pub(crate) fn prefetch_on() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("STRATA_NO_PF").is_none())
}

/// Decode streams every weight once from DRAM, and on the VMs we run on the hardware
/// prefetchers do not keep up (SmolLM2 decode 85 -> 140 tok/s with this): ask for the row
/// [`pf_rows`] ahead of row `wp` while it computes. Called once per row by one-column kernels.
#[inline(always)]
pub(crate) unsafe fn prefetch_ahead(wp: *const u8, rb: usize) {
    if !prefetch_on() {
        return;
    }
    use core::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
    let ahead = wp.wrapping_add(pf_rows(rb) * rb);
    let mut l = 0;
    while l < rb {
        // SAFETY: a prefetch never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(l).cast()) };
        l += 64;
    }
}
