//! Dequantization of weight blocks to f32 or f16, one work-item per block. The float
//! expressions mirror `quant`'s `dequantize_ref` operation by operation (same products in the
//! same order, no FMA contraction), so f32 results are bit-identical and f16 results are the
//! RNE conversion of them.
use crate::abi::{DequantArgs, WG_SIZE, WType, dequant_kernels, get_rows_kernels};
use crate::arch::{Lds, barrier, group_id, thread_id};
use crate::mem::{f32_to_f16, ld_u16, ld_u32, ld_u32x4, st_f32x4_aligned, st_u32x2};
use quant::f16_to_f32;
use quant::iq3_xxs::{IQ3XXS_GRID, ksigns};

/// Where 4 consecutive outputs go.
trait Sink {
    /// # Safety
    /// Outputs `i..i+4` lie in this work-item's part of the output buffer, `i % 4 == 0`.
    unsafe fn put4(&mut self, i: u32, v: [f32; 4]);
}
struct F32Out(*mut f32);
impl Sink for F32Out {
    #[inline(always)]
    unsafe fn put4(&mut self, i: u32, v: [f32; 4]) {
        // SAFETY: caller contract; the buffer is 16-byte aligned (ABI) and i % 4 == 0.
        unsafe { st_f32x4_aligned(self.0.add(i as usize), v) }
    }
}
struct F16Out(*mut u8);
impl Sink for F16Out {
    #[inline(always)]
    unsafe fn put4(&mut self, i: u32, v: [f32; 4]) {
        let lo = f32_to_f16(v[0]) as u32 | (f32_to_f16(v[1]) as u32) << 16;
        let hi = f32_to_f16(v[2]) as u32 | (f32_to_f16(v[3]) as u32) << 16;
        // SAFETY: caller contract; 8 bytes at 2*i, 8-byte aligned.
        unsafe { st_u32x2(self.0.add(2 * i as usize), [lo, hi]) }
    }
}

/// Byte `j` of `w`.
#[inline(always)]
fn byte(w: u32, j: u32) -> u32 {
    (w >> (8 * j)) & 0xff
}

/// # Safety
/// `b` = 34 readable bytes; `o` accepts outputs `0..32` (relative).
#[inline(always)]
unsafe fn q8_0<S: Sink>(b: *const u8, o: &mut S) {
    // SAFETY: caller contract.
    let (d, q) = unsafe { (f16_to_f32(ld_u16(b)), [ld_u32x4(b.add(2)), ld_u32x4(b.add(18))]) };
    for (h, half) in q.iter().enumerate() {
        for (i, &w) in half.iter().enumerate() {
            let v = [0, 1, 2, 3].map(|j| byte(w, j) as u8 as i8 as f32 * d);
            // SAFETY: caller contract.
            unsafe { o.put4((16 * h + 4 * i) as u32, v) };
        }
    }
}

/// # Safety
/// `b` = 18 readable bytes; `o` accepts outputs `0..32` (relative).
#[inline(always)]
unsafe fn iq4_nl<S: Sink>(b: *const u8, o: &mut S) {
    // SAFETY: caller contract.
    let (d, qs) = unsafe { (f16_to_f32(ld_u16(b)), ld_u32x4(b.add(2))) };
    let q = super::mmvq_blocks::iq4nl_weights(qs);
    for (i, &w) in q.iter().enumerate() {
        // `quant::iq4_nl::dequantize_ref`: d * level, one product each.
        let v = [0, 1, 2, 3].map(|j| d * byte(w, j) as u8 as i8 as f32);
        // SAFETY: caller contract.
        unsafe { o.put4(4 * i as u32, v) };
    }
}

/// # Safety
/// `b` = 144 readable bytes; `o` accepts outputs `0..256`.
#[inline(always)]
unsafe fn q4_k<S: Sink>(b: *const u8, o: &mut S) {
    // SAFETY: caller contract.
    let hdr = unsafe { ld_u32x4(b) };
    let d = f16_to_f32(hdr[0] as u16);
    let min = f16_to_f32((hdr[0] >> 16) as u16);
    let (sc, m) = q4_k_scales(hdr);
    for c in 0..4u32 {
        let (d1, m1) = (d * sc[2 * c as usize] as f32, min * m[2 * c as usize] as f32);
        let (d2, m2) = (d * sc[2 * c as usize + 1] as f32, min * m[2 * c as usize + 1] as f32);
        // SAFETY: caller contract (qs chunk c at 16 + 32c).
        let q = unsafe { [ld_u32x4(b.add(16 + 32 * c as usize)), ld_u32x4(b.add(32 + 32 * c as usize))] };
        for (h, half) in q.iter().enumerate() {
            for (i, &w) in half.iter().enumerate() {
                let l = (16 * h + 4 * i) as u32;
                let lo = [0, 1, 2, 3].map(|j| d1 * (byte(w, j) & 0xf) as f32 - m1);
                let hi = [0, 1, 2, 3].map(|j| d2 * (byte(w, j) >> 4) as f32 - m2);
                // SAFETY: caller contract.
                unsafe {
                    o.put4(64 * c + l, lo);
                    o.put4(64 * c + 32 + l, hi);
                }
            }
        }
    }
}

/// The 8 six-bit scales and mins of a Q4_K/Q5_K block from its header words
/// (`hdr[1..4]` = the 12 scale bytes), as `get_scale_min_k4` decodes them.
#[inline(always)]
pub(crate) fn q4_k_scales(hdr: [u32; 4]) -> ([u32; 8], [u32; 8]) {
    let (s0, s1, s2) = (hdr[1], hdr[2], hdr[3]);
    // j < 4: sc = q[j] & 63, m = q[j+4] & 63.
    let sc_lo = s0 & 0x3f3f_3f3f;
    let m_lo = s1 & 0x3f3f_3f3f;
    // j >= 4: sc = (q[j+4] & 15) | (q[j-4] >> 6) << 4, m = (q[j+4] >> 4) | (q[j] >> 6) << 4.
    let sc_hi = (s2 & 0x0f0f_0f0f) | ((s0 >> 2) & 0x3030_3030);
    let m_hi = ((s2 >> 4) & 0x0f0f_0f0f) | ((s1 >> 2) & 0x3030_3030);
    let mut sc = [0u32; 8];
    let mut m = [0u32; 8];
    for j in 0..4u32 {
        sc[j as usize] = byte(sc_lo, j);
        sc[j as usize + 4] = byte(sc_hi, j);
        m[j as usize] = byte(m_lo, j);
        m[j as usize + 4] = byte(m_hi, j);
    }
    (sc, m)
}

/// # Safety
/// `b` = 210 readable bytes; `o` accepts outputs `0..256`.
#[inline(always)]
unsafe fn q6_k<S: Sink>(b: *const u8, o: &mut S) {
    // SAFETY: caller contract (scales at 192, d at 208).
    let (d, scw) = unsafe { (f16_to_f32(ld_u16(b.add(208))), crate::mem::join4(ld_u32x4(b.add(192)))) };
    // A shift of one u128, not an array index: a runtime-indexed array would become a stack
    // (or promoted LDS) object.
    let sc = |i: u32| (scw >> (8 * i)) as u8 as i8 as f32;
    for n in 0..2u32 {
        for i in 0..8u32 {
            // SAFETY: caller contract: ql at 64n + 4i (+32), qh at 128 + 32n + 4i.
            let (ql0, ql1, qh) = unsafe {
                (
                    ld_u32(b.add((64 * n + 4 * i) as usize)),
                    ld_u32(b.add((64 * n + 32 + 4 * i) as usize)),
                    ld_u32(b.add((128 + 32 * n + 4 * i) as usize)),
                )
            };
            let l = 4 * i;
            let is = l / 16;
            for (t, (src, shift_lo, shift_hi)) in
                [(ql0, 0, 0), (ql1, 0, 2), (ql0, 4, 4), (ql1, 4, 6)].into_iter().enumerate()
            {
                let s = d * sc(8 * n + is + 2 * t as u32);
                let v = [0, 1, 2, 3].map(|j| {
                    let q = ((byte(src, j) >> shift_lo) & 0xf) | ((byte(qh, j) >> shift_hi) & 3) << 4;
                    s * (q as i32 - 32) as f32
                });
                // SAFETY: caller contract.
                unsafe { o.put4(128 * n + 32 * t as u32 + l, v) };
            }
        }
    }
}

/// # Safety
/// `b` = 98 readable bytes; `o` accepts outputs `0..256`; the grid is staged in LDS.
#[inline(always)]
unsafe fn iq3_xxs<S: Sink>(b: *const u8, o: &mut S) {
    let lds = Lds::tables();
    // SAFETY: index < 256 words of the grid staged before the barrier in `run`; read-only.
    let grid = |i: u32| unsafe { lds.ld32(4 * (i & 255)) };
    // SAFETY: caller contract.
    let d = f16_to_f32(unsafe { ld_u16(b) });
    for ib in 0..8u32 {
        // SAFETY: caller contract: grid indices at 2 + 8ib, scales/signs at 66 + 4ib.
        let (qa, qb, aux) = unsafe {
            (
                ld_u32(b.add((2 + 8 * ib) as usize)),
                ld_u32(b.add((6 + 8 * ib) as usize)),
                ld_u32(b.add((66 + 4 * ib) as usize)),
            )
        };
        let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
        for l in 0..4u32 {
            let signs = ksigns(aux >> (7 * l)) as u32;
            let qw = if l < 2 { qa } else { qb };
            let g1 = grid(byte(qw, 2 * (l % 2)));
            let g2 = grid(byte(qw, 2 * (l % 2) + 1));
            let v1 = [0, 1, 2, 3].map(|j| db * byte(g1, j) as f32 * if signs & (1 << j) != 0 { -1.0 } else { 1.0 });
            let v2 = [0, 1, 2, 3].map(|j| db * byte(g2, j) as f32 * if signs & (16 << j) != 0 { -1.0 } else { 1.0 });
            // SAFETY: caller contract.
            unsafe {
                o.put4(32 * ib + 8 * l, v1);
                o.put4(32 * ib + 8 * l + 4, v2);
            }
        }
    }
}

/// Shared body: block `g*WG + t` of `nblocks`.
#[inline(always)]
fn run(ty: WType, w: *const u8, y: *mut u8, nblocks: u32, f16: bool) {
    let blk = group_id() * WG_SIZE + thread_id();
    if ty == WType::IQ3XXS {
        // SAFETY: the static table region holds 3 KiB; each of the WG_SIZE = 256 work-items
        // writes its own grid word before the barrier.
        unsafe { Lds::tables().st32(4 * thread_id(), IQ3XXS_GRID[(thread_id() & 255) as usize]) };
        barrier();
    }
    if blk >= nblocks {
        return;
    }
    let bk = ty.block_k();
    // SAFETY: ABI (abi::DequantArgs): `w` holds `nblocks` blocks of `ty`, `y` holds
    // `nblocks * block_k` outputs (16-byte aligned); block `blk` and its outputs belong to this
    // work-item alone.
    unsafe {
        let src = w.add(blk as usize * ty.block_bytes() as usize);
        macro_rules! go {
            ($f:ident) => {
                if f16 {
                    $f(src, &mut F16Out(y.add(blk as usize * bk as usize * 2)))
                } else {
                    $f(src, &mut F32Out((y as *mut f32).add(blk as usize * bk as usize)))
                }
            };
        }
        match ty {
            WType::Q8_0 => go!(q8_0),
            WType::Q4K => go!(q4_k),
            WType::Q6K => go!(q6_k),
            WType::IQ3XXS => go!(iq3_xxs),
            WType::IQ4NL => go!(iq4_nl),
        }
    }
}

macro_rules! define_dequant {
    ($($name:ident $ty:ident $out:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "gpu-kernel" fn $name(w: *const u8, y: *mut u8, nblocks: u32, _pad: u32) {
            run(WType::$ty, w, y, nblocks, stringify!($out).as_bytes()[1] == b'1');
        }
    )*};
}
dequant_kernels!(define_dequant);

const _: () = assert!(core::mem::size_of::<DequantArgs>() == 24);

/// f32 output times a scale (skipped when it is 1.0): `get_rows`.
struct ScaledF32Out(*mut f32, f32);
impl Sink for ScaledF32Out {
    #[inline(always)]
    unsafe fn put4(&mut self, i: u32, v: [f32; 4]) {
        let s = self.1;
        let v = if s != 1.0 { v.map(|x| x * s) } else { v };
        // SAFETY: caller contract; the output row is 16-byte aligned (k % 32 == 0, ABI).
        unsafe { st_f32x4_aligned(self.0.add(i as usize), v) }
    }
}

/// get_rows for a quantized table: block `g` of the `n_ids * k / block_k` output blocks.
#[inline(always)]
fn get_rows_run(ty: WType, table: *const u8, ids: *const u32, out: *mut f32, n_ids: u32, k: u32, scale: f32) {
    let blk = group_id() * WG_SIZE + thread_id();
    if ty == WType::IQ3XXS {
        // SAFETY: as in `run`: every work-item writes its own grid word before the barrier.
        unsafe { Lds::tables().st32(4 * thread_id(), IQ3XXS_GRID[(thread_id() & 255) as usize]) };
        barrier();
    }
    let bk = ty.block_k();
    let nb = k / bk;
    if nb == 0 || blk >= n_ids * nb {
        return;
    }
    let (i, b) = (blk / nb, blk % nb);
    // SAFETY: ABI (abi::GetRowsArgs): ids holds n_ids row indices of `table` (rows of nb
    // blocks), out = [n_ids][k] f32 (16-byte aligned); block (i, b) is this work-item's.
    unsafe {
        let row = *ids.add(i as usize);
        let src = table.add(((row * nb + b) as usize) * ty.block_bytes() as usize);
        let mut o = ScaledF32Out(out.add((i * k + b * bk) as usize), scale);
        match ty {
            WType::Q8_0 => q8_0(src, &mut o),
            WType::Q4K => q4_k(src, &mut o),
            WType::Q6K => q6_k(src, &mut o),
            WType::IQ3XXS => iq3_xxs(src, &mut o),
            WType::IQ4NL => iq4_nl(src, &mut o),
        }
    }
}

macro_rules! define_get_rows {
    ($($name:ident $ty:ident),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "gpu-kernel" fn $name(table: *const u8, ids: *const u32, out: *mut f32, n_ids: u32, k: u32, scale: f32, _pad: u32) {
            get_rows_run(WType::$ty, table, ids, out, n_ids, k, scale);
        }
    )*};
}
get_rows_kernels!(define_get_rows);

/// get_rows for an f32 table, one work-item per element.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn get_rows_f32(
    table: *const f32,
    ids: *const u32,
    out: *mut f32,
    n_ids: u32,
    k: u32,
    scale: f32,
    _pad: u32,
) {
    let g = group_id() * WG_SIZE + thread_id();
    if k == 0 || g >= n_ids * k {
        return;
    }
    // SAFETY: ABI (abi::GetRowsArgs) with f32 rows of k values.
    unsafe {
        let row = *ids.add((g / k) as usize);
        let x = *table.add((row * k + g % k) as usize);
        *out.add(g as usize) = if scale != 1.0 { x * scale } else { x };
    }
}

/// get_rows for an f16 table, one work-item per element.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn get_rows_f16(
    table: *const u16,
    ids: *const u32,
    out: *mut f32,
    n_ids: u32,
    k: u32,
    scale: f32,
    _pad: u32,
) {
    let g = group_id() * WG_SIZE + thread_id();
    if k == 0 || g >= n_ids * k {
        return;
    }
    // SAFETY: ABI (abi::GetRowsArgs) with f16 rows of k values.
    unsafe {
        let row = *ids.add((g / k) as usize);
        let x = f16_to_f32(*table.add((row * k + g % k) as usize));
        *out.add(g as usize) = if scale != 1.0 { x * scale } else { x };
    }
}
