//! Per-format block dot products for MMVQ: one lane, one weight block, `NC` staged Q8_1
//! activation columns. Each weight byte is loaded once (b128 loads at 2-byte alignment);
//! the 4-bit/6-bit/grid decoding is shared by all columns.
use super::dequant::q4_k_scales;
use super::unroll;
use crate::abi::{IQ3_GRID_LDS_BYTES, WType, act_col_bytes, act_q_bytes, act_q_offset};
use crate::arch::{Lds, fma, perm, sdot4, thread_id, usdot4};
use crate::mem::{ld_u16, ld_u32, ld_u32x2, ld_u32x4};
use quant::f16_to_f32;
use quant::iq3_xxs::{IQ3XXS_GRID, ksigns};

/// The staged activation columns in LDS (layout: `abi::act_*`).
pub struct ActCols {
    lds: Lds,
    base: u32,
    colb: u32,
    qb: u32,
}

impl ActCols {
    #[inline(always)]
    pub fn new(lds: Lds, k: u32, table_bytes: u32) -> ActCols {
        ActCols { lds, base: table_bytes, colb: act_col_bytes(k), qb: act_q_bytes(k) }
    }
    /// The 32 quants of column `c` starting at value `k0` (a multiple of 32), as 8 words.
    #[inline(always)]
    fn q(&self, c: usize, k0: u32) -> [u32; 8] {
        let off = self.base + c as u32 * self.colb + act_q_offset(k0);
        // SAFETY: the staged region holds k0..k0+32 of column c (k0 < k), 16-byte aligned
        // (act_q_offset of a multiple of 32 is a multiple of 16); it is read-only after the
        // staging barrier.
        let (a, b) = unsafe { (self.lds.ld128(off), self.lds.ld128(off + 16)) };
        [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
    }
    /// `(d, s)` of Q8_1 block `j` of column `c`.
    #[inline(always)]
    fn ds(&self, c: usize, j: u32) -> (f32, f32) {
        // SAFETY: block j < k/32 of column c, 8-byte aligned, read-only after staging.
        let v = unsafe { self.lds.ld64(self.base + c as u32 * self.colb + self.qb + 8 * j) };
        (f32::from_bits(v[0]), f32::from_bits(v[1]))
    }
}

/// One weight format's contribution to MMVQ.
pub trait MmvqBlock {
    const TY: WType;
    /// Fills the type's LDS tables (before the staging barrier). Called by every work-item.
    #[inline(always)]
    fn stage_tables(_lds: Lds) {}
    /// `acc[c] += dot(block t of the row, column c)` for `c < NC`.
    ///
    /// # Safety
    /// `b` points at the block's `TY.block_bytes()` readable bytes; the columns hold
    /// `(t + 1) * TY.block_k()` values.
    unsafe fn dot<const NC: usize>(b: *const u8, t: u32, cols: &ActCols, acc: &mut [f32; NC]);
}

pub struct Q8_0;
pub struct Q4K;
pub struct Q6K;
pub struct IQ3XXS;
pub struct IQ4NL;

/// Loads 32 bytes at `p` as 8 words.
///
/// # Safety
/// `p..p+32` readable, 2-byte aligned.
#[inline(always)]
unsafe fn ld8(p: *const u8) -> [u32; 8] {
    // SAFETY: caller contract.
    let (a, b) = unsafe { (ld_u32x4(p), ld_u32x4(p.add(16))) };
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

impl MmvqBlock for Q8_0 {
    const TY: WType = WType::Q8_0;
    #[inline(always)]
    unsafe fn dot<const NC: usize>(b: *const u8, t: u32, cols: &ActCols, acc: &mut [f32; NC]) {
        // SAFETY: caller contract: d at 0, 32 quants at 2.
        let (d, q) = unsafe { (f16_to_f32(ld_u16(b)), ld8(b.add(2))) };
        dot32(d, q, t, cols, acc);
    }
}

/// `acc[c] += d · dx_c · (q · x_c)` for the 32 int8 weights `q` of block `t` (a 32-weight
/// block with one scale `d`: Q8_0, IQ4_NL).
#[inline(always)]
fn dot32<const NC: usize>(d: f32, q: [u32; 8], t: u32, cols: &ActCols, acc: &mut [f32; NC]) {
    unroll::<NC>(|c| {
        let x = cols.q(c, 32 * t);
        let mut s = 0;
        for i in 0..8 {
            s = sdot4(q[i], x[i], s);
        }
        acc[c] = fma(d * cols.ds(c, t).0, s as f32, acc[c]);
    });
}

impl MmvqBlock for Q4K {
    const TY: WType = WType::Q4K;
    #[inline(always)]
    unsafe fn dot<const NC: usize>(b: *const u8, t: u32, cols: &ActCols, acc: &mut [f32; NC]) {
        // SAFETY: caller contract: header (d, dmin, 12 scale bytes) at 0, quants at 16.
        let hdr = unsafe { ld_u32x4(b) };
        let d = f16_to_f32(hdr[0] as u16);
        let dmin = f16_to_f32((hdr[0] >> 16) as u16);
        let (sc, m) = q4_k_scales(hdr);
        let mut sd = [0f32; NC];
        let mut sm = [0f32; NC];
        unroll::<4>(|p| {
            let p = p as u32;
            // 32 bytes: low nibbles = sub-block 2p, high nibbles = sub-block 2p+1.
            // SAFETY: caller contract.
            let q = unsafe { ld8(b.add(16 + 32 * p as usize)) };
            let lo = q.map(|w| w & 0x0f0f_0f0f);
            // High nibbles kept in place (x16); the dot is shifted back once per sub-block.
            let hi = q.map(|w| w & 0xf0f0_f0f0);
            let (sc0, sc1) = (sc[2 * p as usize] as f32, sc[2 * p as usize + 1] as f32);
            let (m0, m1) = (m[2 * p as usize] as f32, m[2 * p as usize + 1] as f32);
            unroll::<NC>(|c| {
                let k0 = 256 * t + 64 * p;
                let (x0, x1) = (cols.q(c, k0), cols.q(c, k0 + 32));
                let (d0, s0) = cols.ds(c, 8 * t + 2 * p);
                let (d1, s1) = cols.ds(c, 8 * t + 2 * p + 1);
                let (mut il, mut ih) = (0, 0);
                for i in 0..8 {
                    il = usdot4(lo[i], x0[i], il);
                    ih = usdot4(hi[i], x1[i], ih);
                }
                sd[c] = fma(il as f32, sc0 * d0, sd[c]);
                sd[c] = fma((ih >> 4) as f32, sc1 * d1, sd[c]);
                // Min term from the Q8_1 block sums s = d * sum(q): no dot products needed.
                sm[c] = fma(m0, s0, sm[c]);
                sm[c] = fma(m1, s1, sm[c]);
            });
        });
        unroll::<NC>(|c| acc[c] = fma(d, sd[c], fma(-dmin, sm[c], acc[c])));
    }
}

/// Q6_K 6-bit quants (0..63 per byte) to signed bytes q - 32 without inter-byte borrows:
/// set bit 7 of every byte, subtract 32 per byte, flip bit 7 back.
#[inline(always)]
fn q6_signed(w: u32) -> u32 {
    ((w | 0x8080_8080).wrapping_sub(0x2020_2020)) ^ 0x8080_8080
}

impl MmvqBlock for Q6K {
    const TY: WType = WType::Q6K;
    #[inline(always)]
    unsafe fn dot<const NC: usize>(b: *const u8, t: u32, cols: &ActCols, acc: &mut [f32; NC]) {
        // SAFETY: caller contract: ql at 0, qh at 128, scales at 192, d at 208.
        let (scw, d) = unsafe { (ld_u32x4(b.add(192)), f16_to_f32(ld_u16(b.add(208)))) };
        let scale = |i: u32| ((scw[(i / 4) as usize] >> (8 * (i % 4))) as u8 as i8) as f32;
        let mut s = [0f32; NC];
        unroll::<2>(|n| {
            let n = n as u32;
            // SAFETY: caller contract.
            let (ql0, ql1, qh) = unsafe {
                (ld8(b.add(64 * n as usize)), ld8(b.add(64 * n as usize + 32)), ld8(b.add(128 + 32 * n as usize)))
            };
            unroll::<4>(|tt| {
                let tt = tt as u32;
                let wq: [u32; 8] = core::array::from_fn(|i| {
                    let v = match tt {
                        0 => (ql0[i] & 0x0f0f_0f0f) | ((qh[i] << 4) & 0x3030_3030),
                        1 => (ql1[i] & 0x0f0f_0f0f) | ((qh[i] << 2) & 0x3030_3030),
                        2 => ((ql0[i] >> 4) & 0x0f0f_0f0f) | (qh[i] & 0x3030_3030),
                        _ => ((ql1[i] >> 4) & 0x0f0f_0f0f) | ((qh[i] >> 2) & 0x3030_3030),
                    };
                    q6_signed(v)
                });
                let (sc0, sc1) = (scale(8 * n + 2 * tt), scale(8 * n + 2 * tt + 1));
                unroll::<NC>(|c| {
                    let x = cols.q(c, 256 * t + 128 * n + 32 * tt);
                    let (mut i0, mut i1) = (0, 0);
                    for i in 0..4 {
                        i0 = sdot4(wq[i], x[i], i0);
                        i1 = sdot4(wq[i + 4], x[i + 4], i1);
                    }
                    let da = cols.ds(c, 8 * t + 4 * n + tt).0;
                    s[c] = fma(da, fma(i0 as f32, sc0, i1 as f32 * sc1), s[c]);
                });
            });
        });
        unroll::<NC>(|c| acc[c] = fma(d, s[c], acc[c]));
    }
}

/// LDS offset of the IQ3_XXS sign-mask table (after the 1 KiB grid).
const IQ3_SIGNS: u32 = IQ3_GRID_LDS_BYTES;

impl MmvqBlock for IQ3XXS {
    const TY: WType = WType::IQ3XXS;
    /// Grid (256 x u32) at 0; at 1024, for each 7-bit sign index: byte masks (0xff = negative)
    /// for weights 0..4 and 4..8, and the same masks & 0x01010101. Then
    /// `(g ^ mask) + (mask & 0x01010101)` negates the selected bytes of a grid word (grid
    /// values are 4..62, so no byte carries into the next).
    #[inline(always)]
    fn stage_tables(lds: Lds) {
        let tid = thread_id();
        // SAFETY: WG_SIZE = 256 work-items, each writes one distinct grid word (< 1 KiB) and
        // the first 128 one distinct 16-byte sign entry; read only after the barrier.
        unsafe {
            lds.st32(4 * tid, IQ3XXS_GRID[(tid & 255) as usize]);
            if tid < 128 {
                let s = ksigns(tid) as u32;
                let spread = |bits: u32| {
                    let mut m = 0u32;
                    for j in 0..4 {
                        if bits & (1 << j) != 0 {
                            m |= 0xff << (8 * j);
                        }
                    }
                    m
                };
                let (lo, hi) = (spread(s & 15), spread(s >> 4));
                lds.st128(IQ3_SIGNS + 16 * tid, [lo, hi, lo & 0x0101_0101, hi & 0x0101_0101]);
            }
        }
    }
    #[inline(always)]
    unsafe fn dot<const NC: usize>(b: *const u8, t: u32, cols: &ActCols, acc: &mut [f32; NC]) {
        let lds = Lds::tables();
        // SAFETY: caller contract: d at 0.
        let d = f16_to_f32(unsafe { ld_u16(b) });
        let mut s = [0f32; NC];
        // A run-time loop over the 8 groups (its loads use run-time offsets, no arrays): fully
        // unrolled, the scheduler would hoist the LDS loads of all groups and columns and spill.
        for ib in 0..8u32 {
            // SAFETY: caller contract: 8 grid-index bytes at 2 + 8ib, scale/sign word at 66 + 4ib.
            let (q, aux) = unsafe { (ld_u32x2(b.add(2 + 8 * ib as usize)), ld_u32(b.add(66 + 4 * ib as usize))) };
            let ls = ((aux >> 27) | 1) as f32; // 2 * (aux >> 28) + 1
            let (qa, qb) = (q[0], q[1]);
            let mut w = [0u32; 8];
            unroll::<4>(|l| {
                let l = l as u32;
                let qw = if l < 2 { qa } else { qb };
                let sh = 16 * (l % 2);
                // SAFETY: indices < 256 (grid) and < 128 (signs): inside the tables staged
                // before the barrier; read-only now.
                let (e, g1, g2) = unsafe {
                    (
                        lds.ld128(IQ3_SIGNS + 16 * ((aux >> (7 * l)) & 127)),
                        lds.ld32(4 * ((qw >> sh) & 255)),
                        lds.ld32(4 * ((qw >> (sh + 8)) & 255)),
                    )
                };
                w[2 * l as usize] = (g1 ^ e[0]).wrapping_add(e[2]);
                w[2 * l as usize + 1] = (g2 ^ e[1]).wrapping_add(e[3]);
            });
            unroll::<NC>(|c| {
                let x = cols.q(c, 256 * t + 32 * ib);
                let mut si = 0;
                for i in 0..8 {
                    si = sdot4(w[i], x[i], si);
                }
                s[c] = fma(si as f32, ls * cols.ds(c, 8 * t + ib).0, s[c]);
            });
        }
        unroll::<NC>(|c| acc[c] = fma(d * 0.25, s[c], acc[c]));
    }
}

/// IQ4_NL's 16 levels (`quant::iq4_nl::KVALUES_IQ4NL`) as int8 bytes, 4 a word.
const IQ4NL_LEVELS: [u32; 4] = [level_word(0), level_word(4), level_word(8), level_word(12)];

const fn level_word(i: usize) -> u32 {
    let k = quant::iq4_nl::KVALUES_IQ4NL;
    u32::from_le_bytes([k[i] as u8, k[i + 1] as u8, k[i + 2] as u8, k[i + 3] as u8])
}

/// The level of each byte of `idx` (4 indices 0..16, one a byte), as 4 int8 bytes: two
/// `v_perm_b32` byte selects (levels 0-7 and 8-15) and a blend on bit 3; no table in memory.
#[inline(always)]
fn iq4nl_levels(idx: u32) -> u32 {
    let sel = idx & 0x0707_0707;
    let (lo, hi) = (perm(IQ4NL_LEVELS[1], IQ4NL_LEVELS[0], sel), perm(IQ4NL_LEVELS[3], IQ4NL_LEVELS[2], sel));
    let m = ((idx >> 3) & 0x0101_0101).wrapping_mul(0xff);
    (lo & !m) | (hi & m)
}

/// The 32 int8 weights of an IQ4_NL block from its 16 index bytes: weights 0..16 are the low
/// nibbles, 16..32 the high ones (ggml's layout), 4 a word.
#[inline(always)]
pub(super) fn iq4nl_weights(qs: [u32; 4]) -> [u32; 8] {
    let mut w = [0u32; 8];
    for i in 0..4 {
        w[i] = iq4nl_levels(qs[i] & 0x0f0f_0f0f);
        w[4 + i] = iq4nl_levels((qs[i] >> 4) & 0x0f0f_0f0f);
    }
    w
}

impl MmvqBlock for IQ4NL {
    const TY: WType = WType::IQ4NL;
    #[inline(always)]
    unsafe fn dot<const NC: usize>(b: *const u8, t: u32, cols: &ActCols, acc: &mut [f32; NC]) {
        // SAFETY: caller contract: d at 0, 16 index bytes at 2.
        let (d, qs) = unsafe { (f16_to_f32(ld_u16(b)), ld_u32x4(b.add(2))) };
        dot32(d, iq4nl_weights(qs), t, cols, acc);
    }
}
