//! MMQ (prefill): quantized weights x Q8_1 activation columns, tiled through LDS
//! (semantics, tiling, LDS layout and accumulation order: `abi::MmqArgs`).
//!
//! A workgroup owns 256 weight rows x 64 activation columns. Per chunk of 128 values of K (half
//! a K-quant super-block) it stages (every global byte read once per workgroup, except the
//! K-quant headers, read once per half; wide loads):
//! - the 64 columns' Q8_1 quants (`[step of 16][column][16 bytes]`) and their `d`, `s` as f32;
//! - the 256 rows' weights decoded to signed int8 (`[step][row][16 bytes]`: one WMMA operand
//!   per ds_load_b128) with one f32 scale per 32 values (Q6_K: per 16) and Q4_K's mins.
//!
//! Wave `w` then computes rows `32w..32w+32` (two groups of 16) x all 64 columns as 8 output
//! tiles with the WMMA C layout (lane `l`: row `l % 16` of the group, columns
//! `16t + 2v + l / 16`, v = 0..8):
//! - `*_wmma`: A = 16 activation columns, B = 16 weight rows; per 16-value step one
//!   `v_wmma_i32_16x16x16_iu8` per tile (2 B + 4 A fragment loads for 8 WMMAs);
//! - `*_dot4`: the same outputs per lane with `v_dot4_i32_iu8` (4 per output and step).
//!
//! Both give the exact int32 dot of each 32-value block (16 for Q6_K), then scale it in the
//! fixed order of `abi::MmqArgs`, so the two variants are bit-identical.
use super::dequant::q4_k_scales;
use super::mmvq_blocks::{IQ3XXS as Iq3Tables, MmvqBlock, iq4nl_weights};
use super::unroll;
use crate::abi::{
    IQ3_GRID_LDS_BYTES, MMQ_COLS, MMQ_KC, MMQ_ROWS, MMQ_WQ, MMQ_WS, MMQ_XD, MMQ_XQ, MMQ_XS, Q8_1_BYTES, WG_SIZE, WType,
    mmq_kernels, mmq_wm_offset,
};
use crate::arch::{Lds, barrier, group_id, lane_id, sdot4, thread_id, wave_id, wmma_i32_i8};
use crate::mem::{ld_u16, ld_u32, ld_u32x2, ld_u32x4};
use quant::f16_to_f32;

/// Q8_1 blocks (and weight scale slots of 32 values) per staged chunk.
const BLKS: u32 = MMQ_KC / 32;

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

/// Writes the 32 int8 weights of 32-value block `j` of tile row `r` (steps 2j, 2j+1).
///
/// # Safety
/// `r < MMQ_ROWS`, `j < BLKS`; this work-item is the only writer of these bytes in the chunk.
#[inline(always)]
unsafe fn put_w32(lds: Lds, r: u32, j: u32, q: [u32; 8]) {
    // SAFETY: caller contract; offsets are 16-byte aligned and inside the WQ region.
    unsafe {
        lds.st128(MMQ_WQ + ((2 * j) * MMQ_ROWS + r) * 16, [q[0], q[1], q[2], q[3]]);
        lds.st128(MMQ_WQ + ((2 * j + 1) * MMQ_ROWS + r) * 16, [q[4], q[5], q[6], q[7]]);
    }
}
/// Writes weight scale `slot` of tile row `r`.
///
/// # Safety
/// As `put_w32`, `slot < mmq_scale_slots(ty)`.
#[inline(always)]
unsafe fn put_ws(lds: Lds, r: u32, slot: u32, v: f32) {
    // SAFETY: caller contract.
    unsafe { lds.st32(MMQ_WS + (slot * MMQ_ROWS + r) * 4, v.to_bits()) }
}

/// One weight format's staging for MMQ.
pub trait MmqBlock {
    const TY: WType;
    /// One scale per 16 values (Q6_K) instead of per 32.
    const PER16: bool = false;
    /// Has a min term (Q4_K).
    const MIN: bool = false;
    /// Fills the type's static LDS tables (before the first barrier).
    #[inline(always)]
    fn stage_tables(_lds: Lds) {}
    /// Decodes chunk `kc..kc+nbc*32` of tile rows `0..MMQ_ROWS` (global rows `r0 + r`, those
    /// `< nrows`) into the WQ / WS (/ WM) regions. Called by every work-item between barriers.
    ///
    /// # Safety
    /// `w` holds `nrows` rows of `row_bytes`; `kc + 32 * nbc <= k`, `kc` a multiple of
    /// `MMQ_KC`; the launch has `mmq_lds_bytes(TY)` bytes of dynamic LDS.
    unsafe fn stage_w(lds: Lds, w: *const u8, r0: u32, nrows: u32, row_bytes: u32, kc: u32, nbc: u32);
}

pub struct Q8_0;
pub struct Q4K;
pub struct Q6K;
pub struct IQ3XXS;
pub struct IQ4NL;

/// Staging of a format with 32-weight blocks whose f16 scale comes first (Q8_0, IQ4_NL): 256
/// rows x 4 blocks = 4 items per work-item, neighbours reading neighbouring blocks; `quants`
/// decodes a block's bytes after the scale into its 32 int8 weights.
///
/// # Safety
/// As [`MmqBlock::stage_w`], with blocks of `BB` bytes.
#[inline(always)]
unsafe fn stage_blocks32<const BB: u32>(
    lds: Lds,
    w: *const u8,
    r0: u32,
    nrows: u32,
    row_bytes: u32,
    kc: u32,
    nbc: u32,
    quants: impl Fn(*const u8) -> [u32; 8],
) {
    let tid = thread_id();
    unroll::<4>(|i| {
        let idx = tid + WG_SIZE * i as u32;
        let (r, j) = (idx / BLKS, idx % BLKS);
        if j < nbc && r0 + r < nrows {
            // SAFETY: row r0 + r < nrows, block kc/32 + j < k/32 (caller contract); item
            // (r, j) is this work-item's only.
            unsafe {
                let p = w.add((r0 + r) as usize * row_bytes as usize + ((kc / 32 + j) * BB) as usize);
                let d = f16_to_f32(ld_u16(p));
                put_w32(lds, r, j, quants(p.add(2)));
                put_ws(lds, r, j, d);
            }
        }
    });
}

impl MmqBlock for Q8_0 {
    const TY: WType = WType::Q8_0;
    #[inline(always)]
    unsafe fn stage_w(lds: Lds, w: *const u8, r0: u32, nrows: u32, row_bytes: u32, kc: u32, nbc: u32) {
        // SAFETY: caller contract; a block's 32 quants follow its scale.
        unsafe { stage_blocks32::<34>(lds, w, r0, nrows, row_bytes, kc, nbc, |p| ld8(p)) }
    }
}

impl MmqBlock for IQ4NL {
    const TY: WType = WType::IQ4NL;
    #[inline(always)]
    unsafe fn stage_w(lds: Lds, w: *const u8, r0: u32, nrows: u32, row_bytes: u32, kc: u32, nbc: u32) {
        // SAFETY: caller contract; a block's 16 index bytes follow its scale.
        unsafe { stage_blocks32::<18>(lds, w, r0, nrows, row_bytes, kc, nbc, |p| iq4nl_weights(ld_u32x4(p))) }
    }
}

impl MmqBlock for Q4K {
    const TY: WType = WType::Q4K;
    const MIN: bool = true;
    #[inline(always)]
    unsafe fn stage_w(lds: Lds, w: *const u8, r0: u32, nrows: u32, row_bytes: u32, kc: u32, _nbc: u32) {
        // One row per work-item: half `hf` of super-block `kc / 256` (its 16-byte header is
        // read by both halves).
        let r = thread_id();
        let hf = (kc / 128) % 2;
        if r < MMQ_ROWS && r0 + r < nrows {
            let wm = mmq_wm_offset(WType::Q4K);
            // SAFETY: block kc/256 of row r0 + r exists (caller contract); this work-item is
            // the only writer of row r.
            unsafe {
                let b = w.add((r0 + r) as usize * row_bytes as usize + (kc / 256 * 144) as usize);
                let hdr = ld_u32x4(b);
                let d = f16_to_f32(hdr[0] as u16);
                let dmin = f16_to_f32((hdr[0] >> 16) as u16);
                let (sc, m) = q4_k_scales(hdr);
                unroll::<2>(|p| {
                    let q = ld8(b.add(16 + 64 * hf as usize + 32 * p));
                    let p = p as u32;
                    put_w32(lds, r, 2 * p, q.map(|x| x & 0x0f0f_0f0f));
                    put_w32(lds, r, 2 * p + 1, q.map(|x| (x >> 4) & 0x0f0f_0f0f));
                });
                unroll::<4>(|j| {
                    // Sub-block 4 hf + j, selected without a run-time array index.
                    let (s_, m_) = if hf == 0 { (sc[j], m[j]) } else { (sc[j + 4], m[j + 4]) };
                    put_ws(lds, r, j as u32, d * s_ as f32);
                    lds.st32(wm + (j as u32 * MMQ_ROWS + r) * 4, (dmin * m_ as f32).to_bits());
                });
            }
        }
    }
}

/// Q6_K 6-bit quants (0..63 per byte) to signed bytes q - 32 without inter-byte borrows.
#[inline(always)]
fn q6_signed(w: u32) -> u32 {
    ((w | 0x8080_8080).wrapping_sub(0x2020_2020)) ^ 0x8080_8080
}

impl MmqBlock for Q6K {
    const TY: WType = WType::Q6K;
    const PER16: bool = true;
    #[inline(always)]
    unsafe fn stage_w(lds: Lds, w: *const u8, r0: u32, nrows: u32, row_bytes: u32, kc: u32, _nbc: u32) {
        let r = thread_id();
        let n = ((kc / 128) % 2) as usize;
        if r < MMQ_ROWS && r0 + r < nrows {
            // SAFETY: as Q4K (ql at 0, qh at 128, scales at 192, d at 208); half n uses
            // ql[64n..64n+64], qh[32n..32n+32], scales[8n..8n+8].
            unsafe {
                let b = w.add((r0 + r) as usize * row_bytes as usize + (kc / 256 * 210) as usize);
                let (scw, d) = (ld_u32x2(b.add(192 + 8 * n)), f16_to_f32(ld_u16(b.add(208))));
                unroll::<2>(|wi| {
                    unroll::<4>(|bi| {
                        let sc = (scw[wi] >> (8 * bi)) as u8 as i8;
                        put_ws(lds, r, (4 * wi + bi) as u32, d * sc as f32);
                    });
                });
                let (ql0, ql1, qh) = (ld8(b.add(64 * n)), ld8(b.add(64 * n + 32)), ld8(b.add(128 + 32 * n)));
                unroll::<4>(|tt| {
                    let wq: [u32; 8] = core::array::from_fn(|i| {
                        let v = match tt {
                            0 => (ql0[i] & 0x0f0f_0f0f) | ((qh[i] << 4) & 0x3030_3030),
                            1 => (ql1[i] & 0x0f0f_0f0f) | ((qh[i] << 2) & 0x3030_3030),
                            2 => ((ql0[i] >> 4) & 0x0f0f_0f0f) | (qh[i] & 0x3030_3030),
                            _ => ((ql1[i] >> 4) & 0x0f0f_0f0f) | ((qh[i] >> 2) & 0x3030_3030),
                        };
                        q6_signed(v)
                    });
                    put_w32(lds, r, tt as u32, wq);
                });
            }
        }
    }
}

impl MmqBlock for IQ3XXS {
    const TY: WType = WType::IQ3XXS;
    #[inline(always)]
    fn stage_tables(lds: Lds) {
        <Iq3Tables as MmvqBlock>::stage_tables(lds)
    }
    #[inline(always)]
    unsafe fn stage_w(lds: Lds, w: *const u8, r0: u32, nrows: u32, row_bytes: u32, kc: u32, _nbc: u32) {
        let r = thread_id();
        if r < MMQ_ROWS && r0 + r < nrows {
            let tables = Lds::tables();
            // SAFETY: as Q4K (d at 0, grid indices at 2, scale/sign words at 66); the tables
            // were staged before the chunk's first barrier.
            unsafe {
                let b = w.add((r0 + r) as usize * row_bytes as usize + (kc / 256 * 98) as usize);
                let d = f16_to_f32(ld_u16(b));
                let h4 = 4 * ((kc / 128) % 2);
                for ib in 0..4u32 {
                    let g = h4 + ib;
                    let (q, aux) = (ld_u32x2(b.add(2 + 8 * g as usize)), ld_u32(b.add(66 + 4 * g as usize)));
                    let mut wq = [0u32; 8];
                    unroll::<4>(|l| {
                        let l = l as u32;
                        let qw = if l < 2 { q[0] } else { q[1] };
                        let sh = 16 * (l % 2);
                        let (e, g1, g2) = (
                            tables.ld128(IQ3_GRID_LDS_BYTES + 16 * ((aux >> (7 * l)) & 127)),
                            tables.ld32(4 * ((qw >> sh) & 255)),
                            tables.ld32(4 * ((qw >> (sh + 8)) & 255)),
                        );
                        wq[2 * l as usize] = (g1 ^ e[0]).wrapping_add(e[2]);
                        wq[2 * l as usize + 1] = (g2 ^ e[1]).wrapping_add(e[3]);
                    });
                    put_w32(lds, r, ib, wq);
                    put_ws(lds, r, ib, d * (0.5 + (aux >> 28) as f32) * 0.5);
                }
            }
        }
    }
}

/// LDS index of column `c` (0..64) in the `d`/`s` rows: `16 t + 8 (i % 2) + i / 2`.
#[inline(always)]
fn col_perm(c: u32) -> u32 {
    (c & !15) | ((c & 1) << 3) | ((c & 15) >> 1)
}

/// Stages chunk blocks `b0..b0+nbc` of columns `c0..c0+64` (zeros past `ncols`).
///
/// # Safety
/// `x` holds `ncols` columns of `nb` Q8_1 blocks; `b0 + nbc <= nb`; LDS as `stage_w`.
#[inline(always)]
unsafe fn stage_x(lds: Lds, x: *const u8, c0: u32, ncols: u32, nb: u32, b0: u32, nbc: u32) {
    let tid = thread_id();
    const { assert!(MMQ_COLS * BLKS == WG_SIZE) };
    unroll::<1>(|i| {
        let idx = tid + WG_SIZE * i as u32;
        let (c, j) = (idx / BLKS, idx % BLKS);
        if j < nbc {
            let (h, q0, q1) = if c0 + c < ncols {
                // SAFETY: block b0 + j < nb of column c0 + c < ncols (caller contract).
                unsafe {
                    let p = x.add(((c0 + c) * nb + b0 + j) as usize * Q8_1_BYTES as usize);
                    (ld_u32(p), ld_u32x4(p.add(4)), ld_u32x4(p.add(20)))
                }
            } else {
                (0, [0; 4], [0; 4])
            };
            let pc = col_perm(c);
            // SAFETY: item (c, j) is this work-item's only; 16/4-byte aligned offsets inside
            // the XQ / XD / XS regions.
            unsafe {
                lds.st128(MMQ_XQ + ((2 * j) * MMQ_COLS + c) * 16, q0);
                lds.st128(MMQ_XQ + ((2 * j + 1) * MMQ_COLS + c) * 16, q1);
                lds.st32(MMQ_XD + (j * MMQ_COLS + pc) * 4, f16_to_f32(h as u16).to_bits());
                lds.st32(MMQ_XS + (j * MMQ_COLS + pc) * 4, f16_to_f32((h >> 16) as u16).to_bits());
            }
        }
    });
}

/// Straight-line repetition of a block with `$i` = 0..N (a `u32` constant in each copy). Used
/// instead of `unroll` closures where the accumulator arrays live: a closure body that LLVM
/// does not inline before codegen (large bodies called 4-8 times) takes the arrays by
/// reference, and they end up in scratch memory.
macro_rules! rep {
    (2, $i:ident, $b:block) => {{
        {
            let $i: u32 = 0;
            $b
        }
        {
            let $i: u32 = 1;
            $b
        }
    }};
    (4, $i:ident, $b:block) => {{
        rep!(2, $i, $b);
        {
            let $i: u32 = 2;
            $b
        }
        {
            let $i: u32 = 3;
            $b
        }
    }};
    (8, $i:ident, $b:block) => {{
        rep!(4, $i, $b);
        {
            let $i: u32 = 4;
            $b
        }
        {
            let $i: u32 = 5;
            $b
        }
        {
            let $i: u32 = 6;
            $b
        }
        {
            let $i: u32 = 7;
            $b
        }
    }};
}

/// Adds one block's (or half-block's) int dots `q` (64: row group `g`, tile `t`, element `v`
/// at `32g + 8t + v`) with weight scale `slot` (and, for Q4_K, the min term of block `j`) to the
/// accumulators, in the order of `abi::MmqArgs`. (A macro, not a function, for the reason given
/// at `rep!`.)
macro_rules! apply {
    ($B:ty, $lds:expr, $row:expr, $half:expr, $j:expr, $slot:expr, $q:expr, $acc:expr) => {{
        // SAFETY: LDS staged for the chunk (read-only phase); 4-byte (scales) and 16-byte
        // (d/s: (j*64 + 16t + 8half)*4 is a multiple of 32) aligned reads inside the regions.
        unsafe {
            let ws = [
                f32::from_bits($lds.ld32(MMQ_WS + ($slot * MMQ_ROWS + $row) * 4)),
                f32::from_bits($lds.ld32(MMQ_WS + ($slot * MMQ_ROWS + $row + 16) * 4)),
            ];
            let wm = if <$B>::MIN {
                let o = mmq_wm_offset(<$B>::TY) + ($j * MMQ_ROWS + $row) * 4;
                [f32::from_bits($lds.ld32(o)), f32::from_bits($lds.ld32(o + 64))]
            } else {
                [0.0; 2]
            };
            rep!(4, t, {
                let o = ($j * MMQ_COLS + 16 * t + 8 * $half) * 4;
                let (d0, d1) = ($lds.ld128(MMQ_XD + o), $lds.ld128(MMQ_XD + o + 16));
                let dx = [d0[0], d0[1], d0[2], d0[3], d1[0], d1[1], d1[2], d1[3]];
                rep!(2, g, {
                    rep!(8, v, {
                        let i = (32 * g + 8 * t + v) as usize;
                        $acc[i] = $acc[i] + ($q[i] as f32) * (ws[g as usize] * f32::from_bits(dx[v as usize]));
                    });
                });
                if <$B>::MIN {
                    let (s0, s1) = ($lds.ld128(MMQ_XS + o), $lds.ld128(MMQ_XS + o + 16));
                    let sx = [s0[0], s0[1], s0[2], s0[3], s1[0], s1[1], s1[2], s1[3]];
                    rep!(2, g, {
                        rep!(8, v, {
                            let i = (32 * g + 8 * t + v) as usize;
                            $acc[i] = $acc[i] - wm[g as usize] * f32::from_bits(sx[v as usize]);
                        });
                    });
                }
            });
        }
    }};
}

/// The dot4 variant of one 32-value block `j`: output by output (the same outputs and, per
/// output, the same sequence of f32 operations as the WMMA path + `apply!`), so only one int
/// dot is live at a time.
///
/// # Safety
/// LDS staged for the chunk (read-only phase); `row + 16 < MMQ_ROWS`, `j < BLKS`.
#[inline(always)]
unsafe fn dot4_block<B: MmqBlock>(lds: Lds, row: u32, half: u32, j: u32, acc: &mut [f32; 64]) {
    // SAFETY: caller contract; aligned offsets inside the staged regions.
    unsafe {
        let wq = |s: u32, g: u32| lds.ld128(MMQ_WQ + (s * MMQ_ROWS + row + 16 * g) * 16);
        let bw = [[wq(2 * j, 0), wq(2 * j, 1)], [wq(2 * j + 1, 0), wq(2 * j + 1, 1)]];
        let wsl = |slot: u32, g: u32| f32::from_bits(lds.ld32(MMQ_WS + (slot * MMQ_ROWS + row + 16 * g) * 4));
        let ws = if B::PER16 {
            [[wsl(2 * j, 0), wsl(2 * j, 1)], [wsl(2 * j + 1, 0), wsl(2 * j + 1, 1)]]
        } else {
            [[wsl(j, 0), wsl(j, 1)]; 2]
        };
        let wm = if B::MIN {
            let o = mmq_wm_offset(B::TY) + (j * MMQ_ROWS + row) * 4;
            [f32::from_bits(lds.ld32(o)), f32::from_bits(lds.ld32(o + 64))]
        } else {
            [0.0; 2]
        };
        let dot = |a: [u32; 4], b: [u32; 4], c: i32| {
            sdot4(a[3], b[3], sdot4(a[2], b[2], sdot4(a[1], b[1], sdot4(a[0], b[0], c))))
        };
        rep!(4, t, {
            let o = (j * MMQ_COLS + 16 * t + 8 * half) * 4;
            let (d0, d1) = (lds.ld128(MMQ_XD + o), lds.ld128(MMQ_XD + o + 16));
            let dx = [d0[0], d0[1], d0[2], d0[3], d1[0], d1[1], d1[2], d1[3]];
            let sx = if B::MIN {
                let (s0, s1) = (lds.ld128(MMQ_XS + o), lds.ld128(MMQ_XS + o + 16));
                [s0[0], s0[1], s0[2], s0[3], s1[0], s1[1], s1[2], s1[3]]
            } else {
                [0; 8]
            };
            rep!(8, v, {
                let col = 16 * t + 2 * v + half;
                let a0 = lds.ld128(MMQ_XQ + ((2 * j) * MMQ_COLS + col) * 16);
                let a1 = lds.ld128(MMQ_XQ + ((2 * j + 1) * MMQ_COLS + col) * 16);
                let dxv = f32::from_bits(dx[v as usize]);
                rep!(2, g, {
                    let (i, gi) = ((32 * g + 8 * t + v) as usize, g as usize);
                    if B::PER16 {
                        let (q0, q1) = (dot(a0, bw[0][gi], 0), dot(a1, bw[1][gi], 0));
                        acc[i] = acc[i] + (q0 as f32) * (ws[0][gi] * dxv);
                        acc[i] = acc[i] + (q1 as f32) * (ws[1][gi] * dxv);
                    } else {
                        let q = dot(a1, bw[1][gi], dot(a0, bw[0][gi], 0));
                        acc[i] = acc[i] + (q as f32) * (ws[0][gi] * dxv);
                        if B::MIN {
                            acc[i] = acc[i] - wm[gi] * f32::from_bits(sx[v as usize]);
                        }
                    }
                });
            });
        });
    }
}

/// The kernel body (arguments as `abi::MmqArgs`).
///
/// # Safety
/// The buffers satisfy `abi::MmqArgs`; the launch has `WG_SIZE` work-items and
/// `mmq_lds_bytes(B::TY)` bytes of dynamic LDS.
#[inline(always)]
unsafe fn mmq<B: MmqBlock, const DOT4: bool>(
    w: *const u8,
    x: *const u8,
    y: *mut f32,
    nrows: u32,
    ncols: u32,
    k: u32,
    y_stride: u32,
) {
    let n_ct = ncols.div_ceil(MMQ_COLS);
    let g = group_id();
    if n_ct == 0 || g >= n_ct * nrows.div_ceil(MMQ_ROWS) {
        return; // workgroup-uniform: no barrier is skipped by part of the group
    }
    // Column tile fastest: the workgroups that read the same weight rows run side by side, so
    // on a card all but the first read of a weight tile can hit L2.
    let (r0, c0) = ((g / n_ct) * MMQ_ROWS, (g % n_ct) * MMQ_COLS);
    let lds = Lds::get();
    B::stage_tables(Lds::tables());
    let nb = k / 32;
    let row_bytes = k / B::TY.block_k() * B::TY.block_bytes();
    let lane = lane_id();
    let (me, half) = (lane & 15, lane >> 4);
    // Tile rows of this lane: `row` (group 0) and `row + 16` (group 1).
    let row = wave_id() * 32 + me;
    let mut acc = [0f32; 64];
    let mut kc = 0;
    while kc < k {
        let nbc = ((k - kc) / 32).min(BLKS);
        // The previous chunk's reads (and the tables' writes) are done.
        barrier();
        // SAFETY: caller contract; chunk kc.. of k.
        unsafe {
            stage_x(lds, x, c0, ncols, nb, kc / 32, nbc);
            B::stage_w(lds, w, r0, nrows, row_bytes, kc, nbc);
        }
        barrier();
        for j in 0..nbc {
            if DOT4 {
                // SAFETY: as below.
                unsafe { dot4_block::<B>(lds, row, half, j, &mut acc) };
                continue;
            }
            let mut q = [0i32; 64];
            rep!(2, h, {
                let s = 2 * j + h;
                // SAFETY: staged chunk, read-only until the next barrier; 16-byte aligned
                // offsets inside WQ / XQ.
                let b = unsafe {
                    [lds.ld128(MMQ_WQ + (s * MMQ_ROWS + row) * 16), lds.ld128(MMQ_WQ + (s * MMQ_ROWS + row + 16) * 16)]
                };
                rep!(4, t, {
                    // SAFETY: as above.
                    let a = unsafe { lds.ld128(MMQ_XQ + (s * MMQ_COLS + 16 * t + me) * 16) };
                    rep!(2, g, {
                        let i = (32 * g + 8 * t) as usize;
                        let c = wmma_i32_i8(
                            a,
                            b[g as usize],
                            [q[i], q[i + 1], q[i + 2], q[i + 3], q[i + 4], q[i + 5], q[i + 6], q[i + 7]],
                        );
                        rep!(8, v, {
                            q[i + v as usize] = c[v as usize];
                        });
                    });
                });
                if B::PER16 {
                    apply!(B, lds, row, half, j, s, q, acc);
                    q = [0; 64];
                }
            });
            if !B::PER16 {
                apply!(B, lds, row, half, j, j, q, acc);
            }
        }
        kc += MMQ_KC;
    }
    rep!(2, g, {
        let r = r0 + row + 16 * g;
        if r < nrows {
            rep!(4, t, {
                rep!(8, v, {
                    let c = c0 + 16 * t + 2 * v + half;
                    if c < ncols {
                        // SAFETY: `y` holds `ncols` columns of `y_stride >= nrows` f32 (ABI);
                        // each output has one writer.
                        unsafe { *y.add((c * y_stride + r) as usize) = acc[(32 * g + 8 * t + v) as usize] };
                    }
                });
            });
        }
    });
}

macro_rules! define_mmq {
    ($($name:ident $ty:ident $dot4:literal),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "gpu-kernel" fn $name(w: *const u8, x: *const u8, y: *mut f32, nrows: u32, ncols: u32, k: u32, y_stride: u32) {
            // SAFETY: the host launches per abi::MmqArgs (gpu-executor/src/ops.rs).
            unsafe { mmq::<$ty, $dot4>(w, x, y, nrows, ncols, k, y_stride) }
        }
    )*};
}
mmq_kernels!(define_mmq);
