//! Every raw gfx11 intrinsic the kernels use, each behind a safe (or narrowly `unsafe`)
//! wrapper. Nothing outside this module declares an LLVM intrinsic or touches the LDS shim.
//!
//! Why these and not the obvious alternatives (ISA checked with llvm-objdump-22):
//! - `llvm.amdgcn.sdot4`/`sudot4` lower to one `v_dot4_i32_iu8`; a byte dot written in plain
//!   Rust becomes ~8 bfe/mad instructions.
//! - Wave reductions use DPP `row_xmask` butterflies (folded into `v_add_f32_dpp`) plus one
//!   `v_permlanex16_b32` across the two 16-lane rows: 6 VALU for 32 lanes. `wave_reduce_*`
//!   compiles to a 32-trip scalar loop and `ds_swizzle`/`ds_bpermute` need LDS round trips.
//! - The workgroup barrier is fenced (HIP `__syncthreads`): a bare `s_barrier` on gfx11 is not
//!   preceded by `s_waitcnt lgkmcnt(0)` and races with pending LDS stores.
use core::arch::amdgpu;

unsafe extern "unadjusted" {
    #[link_name = "llvm.amdgcn.sdot4"]
    fn llvm_sdot4(a: i32, b: i32, c: i32, clamp: bool) -> i32;
    #[link_name = "llvm.amdgcn.sudot4"]
    fn llvm_sudot4(a_signed: bool, a: i32, b_signed: bool, b: i32, c: i32, clamp: bool) -> i32;
    #[allow(improper_ctypes)]
    #[link_name = "llvm.amdgcn.wmma.i32.16x16x16.iu8.v8i32.v4i32"]
    fn llvm_wmma_i32_iu8(a_signed: bool, a: I32x4, b_signed: bool, b: I32x4, c: I32x8, clamp: bool) -> I32x8;
    #[allow(improper_ctypes)]
    #[link_name = "llvm.amdgcn.wmma.f32.16x16x16.f16.v8f32.v16f16"]
    fn llvm_wmma_f32_f16(a: F16x16, b: F16x16, c: F32x8) -> F32x8;
    #[link_name = "llvm.arithmetic.fence.f32"]
    fn llvm_arithmetic_fence_f32(x: f32) -> f32;
    #[link_name = "llvm.amdgcn.ds.swizzle"]
    fn llvm_ds_swizzle(x: i32, pattern: i32) -> i32;
    #[link_name = "llvm.amdgcn.ballot.i32"]
    fn llvm_ballot_i32(b: bool) -> i32;
    #[link_name = "llvm.amdgcn.perm"]
    fn llvm_perm(a: i32, b: i32, sel: i32) -> i32;
}

/// Byte select (`v_perm_b32`): byte `i` of the result is byte `sel.byte[i]` of the 8 bytes
/// `a:b` (0-3 from `b`, 4-7 from `a`; the kernels pass only selectors below 8).
#[inline(always)]
pub fn perm(a: u32, b: u32, sel: u32) -> u32 {
    // SAFETY: a pure arithmetic intrinsic available on every gfx11 target; no memory access.
    unsafe { llvm_perm(a as i32, b as i32, sel as i32) as u32 }
}

/// Bit `l` set for every active lane `l` of the wave whose `b` is true (`v_cmp` into an SGPR;
/// wave-uniform result). Call in uniform control flow.
#[inline(always)]
pub fn ballot(b: bool) -> u32 {
    // SAFETY: a pure cross-lane intrinsic with no memory access.
    unsafe { llvm_ballot_i32(b) as u32 }
}

unsafe extern "C" {
    /// Generic pointer to the launch-sized LDS region (defined in `lds_shim.ll`).
    fn strata_lds_base() -> *mut u8;
    /// Generic pointer to the 3 KiB static LDS table region (defined in `lds_shim.ll`).
    fn strata_lds_tables_base() -> *mut u8;
    /// fence(workgroup, release); s_barrier; fence(workgroup, acquire).
    fn strata_barrier_wg();
}

/// Work-item index in the (1-D) workgroup.
#[inline(always)]
pub fn thread_id() -> u32 {
    amdgpu::workitem_id_x()
}
/// Workgroup index (1-D grid).
#[inline(always)]
pub fn group_id() -> u32 {
    amdgpu::workgroup_id_x()
}
/// Workgroup index along y (2-D grids).
#[inline(always)]
pub fn group_id_y() -> u32 {
    amdgpu::workgroup_id_y()
}
/// Lane within the wave32.
#[inline(always)]
pub fn lane_id() -> u32 {
    amdgpu::workitem_id_x() & 31
}
/// Wave index within the workgroup, made wave-uniform (an SGPR) for the compiler.
#[inline(always)]
pub fn wave_id() -> u32 {
    amdgpu::readfirstlane_u32(amdgpu::workitem_id_x() >> 5)
}
/// Marks a value the caller knows to be wave-uniform, so it lives in an SGPR.
#[inline(always)]
pub fn uniform(x: u32) -> u32 {
    amdgpu::readfirstlane_u32(x)
}

/// Signed x signed byte dot: `acc + sum_i a.i8[i] * b.i8[i]` (`v_dot4_i32_iu8 neg_lo:[1,1,0]`).
#[inline(always)]
pub fn sdot4(a: u32, b: u32, acc: i32) -> i32 {
    // SAFETY: a pure arithmetic intrinsic available on every gfx11 target; no memory access.
    unsafe { llvm_sdot4(a as i32, b as i32, acc, false) }
}
/// Unsigned (a) x signed (b) byte dot (`v_dot4_i32_iu8 neg_lo:[0,1,0]`).
#[inline(always)]
pub fn usdot4(a: u32, b: u32, acc: i32) -> i32 {
    // SAFETY: pure arithmetic intrinsic, see `sdot4`.
    unsafe { llvm_sudot4(false, a as i32, true, b as i32, acc, false) }
}

/// DPP16 move with `bound_ctrl:1` and all rows/banks enabled; lanes whose source is invalid
/// read 0. `CTRL` is the gfx10+ dpp_ctrl encoding (0x160 + n = `row_xmask:n`).
#[inline(always)]
fn dpp<const CTRL: u32>(x: u32) -> u32 {
    // SAFETY: a register-only cross-lane move within a 16-lane row; CTRL is a valid gfx11
    // dpp_ctrl (only row_xmask values are instantiated below). Kernels call it in uniform
    // control flow (rustc marks GPU functions convergent, so it is not moved across branches).
    unsafe { amdgpu::update_dpp::<CTRL, 0xF, 0xF, true>(0, x) }
}
/// Value of the lane `lane ^ 16` (the other 16-lane row).
#[inline(always)]
fn swap_rows(x: u32) -> u32 {
    // SAFETY: register-only; selects 0x76543210/0xfedcba98 map lane i of one row to lane i of
    // the other row. All lanes are active where reductions run (uniform control flow).
    unsafe { amdgpu::permlanex16_u32::<false, false>(0, x, 0x7654_3210, 0xfedc_ba98) }
}

/// Sum of `x` over aligned groups of `1 << lg` lanes (lg = 0..=5); every lane of a group gets
/// the group's sum. `lg` must be wave-uniform. Butterfly: `row_xmask` 1, 2, 4, 8 then
/// `permlanex16` for the two 16-lane halves.
#[inline(always)]
pub fn group_sum_f32(x: f32, lg: u32) -> f32 {
    let mut x = x;
    if lg >= 1 {
        x += f32::from_bits(dpp::<0x161>(x.to_bits()));
    }
    if lg >= 2 {
        x += f32::from_bits(dpp::<0x162>(x.to_bits()));
    }
    if lg >= 3 {
        x += f32::from_bits(dpp::<0x164>(x.to_bits()));
    }
    if lg >= 4 {
        x += f32::from_bits(dpp::<0x168>(x.to_bits()));
    }
    if lg >= 5 {
        x += f32::from_bits(swap_rows(x.to_bits()));
    }
    x
}

/// `group_sum_f32` of every element of `acc`, with one wave-uniform branch per butterfly step
/// for all columns (not one per column and step).
#[inline(always)]
pub fn group_sum_f32xn<const N: usize>(acc: &mut [f32; N], lg: u32) {
    if lg >= 1 {
        crate::ops::unroll::<N>(|c| acc[c] += f32::from_bits(dpp::<0x161>(acc[c].to_bits())));
    }
    if lg >= 2 {
        crate::ops::unroll::<N>(|c| acc[c] += f32::from_bits(dpp::<0x162>(acc[c].to_bits())));
    }
    if lg >= 3 {
        crate::ops::unroll::<N>(|c| acc[c] += f32::from_bits(dpp::<0x164>(acc[c].to_bits())));
    }
    if lg >= 4 {
        crate::ops::unroll::<N>(|c| acc[c] += f32::from_bits(dpp::<0x168>(acc[c].to_bits())));
    }
    if lg >= 5 {
        crate::ops::unroll::<N>(|c| acc[c] += f32::from_bits(swap_rows(acc[c].to_bits())));
    }
}

/// Sum over all 32 lanes (every lane gets it).
#[inline(always)]
pub fn wave_sum_i32(x: i32) -> i32 {
    let x = x.wrapping_add(dpp::<0x161>(x as u32) as i32);
    let x = x.wrapping_add(dpp::<0x162>(x as u32) as i32);
    let x = x.wrapping_add(dpp::<0x164>(x as u32) as i32);
    let x = x.wrapping_add(dpp::<0x168>(x as u32) as i32);
    x.wrapping_add(swap_rows(x as u32) as i32)
}

/// Max over all 32 lanes of a non-negative f32 given as bits (monotone as u32).
#[inline(always)]
pub fn wave_max_u32(x: u32) -> u32 {
    let x = x.max(dpp::<0x161>(x));
    let x = x.max(dpp::<0x162>(x));
    let x = x.max(dpp::<0x164>(x));
    let x = x.max(dpp::<0x168>(x));
    x.max(swap_rows(x))
}
/// Min over all 32 lanes.
#[inline(always)]
pub fn wave_min_u32(x: u32) -> u32 {
    // bound_ctrl:1 gives 0 for an invalid source lane, but row_xmask sources are always valid.
    let x = x.min(dpp::<0x161>(x));
    let x = x.min(dpp::<0x162>(x));
    let x = x.min(dpp::<0x164>(x));
    let x = x.min(dpp::<0x168>(x));
    x.min(swap_rows(x))
}
/// Max over all 32 lanes of an f32 (`v_max_f32`; every lane gets it). NaN-free inputs.
#[inline(always)]
pub fn wave_max_f32(x: f32) -> f32 {
    let m = |a: f32, b: u32| a.max(f32::from_bits(b));
    let x = m(x, dpp::<0x161>(x.to_bits()));
    let x = m(x, dpp::<0x162>(x.to_bits()));
    let x = m(x, dpp::<0x164>(x.to_bits()));
    let x = m(x, dpp::<0x168>(x.to_bits()));
    m(x, swap_rows(x.to_bits()))
}
/// The f64 `x` of lane `lane` (wave-uniform), as a scalar.
#[inline(always)]
pub fn read_lane_f64(x: f64, lane: u32) -> f64 {
    let b = x.to_bits();
    f64::from_bits(read_lane(b as u32, lane) as u64 | (read_lane((b >> 32) as u32, lane) as u64) << 32)
}
/// The f32 `x` of lane `lane` (wave-uniform), as a scalar.
#[inline(always)]
pub fn read_lane_f32(x: f32, lane: u32) -> f32 {
    f32::from_bits(read_lane(x.to_bits(), lane))
}
/// The value of lane `lane ^ 1` (used to pair neighbouring lanes).
#[inline(always)]
pub fn xor1_i32(x: i32) -> i32 {
    dpp::<0x161>(x as u32) as i32
}
/// The value `x` of lane `lane` (wave-uniform `lane`), as a scalar.
#[inline(always)]
pub fn read_lane(x: u32, lane: u32) -> u32 {
    // SAFETY: v_readlane_b32 with a wave-uniform lane index < 32 (masked); register only.
    unsafe { amdgpu::readlane_u32(x, lane & 31) }
}

/// The u32 of lane `lane ^ 16` (the other 16-lane half).
#[inline(always)]
pub fn other_half_u32(x: u32) -> u32 {
    swap_rows(x)
}
/// The f32 of lane `lane ^ 16` (the other 16-lane half).
#[inline(always)]
pub fn other_half_f32(x: f32) -> f32 {
    f32::from_bits(swap_rows(x.to_bits()))
}

/// A WMMA f16 operand: 16 halves (lane `l` holds row/column `l % 16`, element k in VGPR k/2,
/// half k%2).
#[repr(simd)]
#[derive(Clone, Copy)]
pub struct F16x16(pub [f16; 16]);
/// A WMMA f32 accumulator: element v of lane l is row `2v + l/16`, column `l % 16`.
#[repr(simd)]
#[derive(Clone, Copy)]
pub struct F32x8(pub [f32; 8]);

/// A WMMA iu8 operand: 16 bytes (element k in VGPR k/4, byte k%4).
#[repr(simd)]
#[derive(Clone, Copy)]
pub struct I32x4(pub [i32; 4]);
/// A WMMA i32 accumulator (layout of [`F32x8`]).
#[repr(simd)]
#[derive(Clone, Copy)]
pub struct I32x8(pub [i32; 8]);

/// `D = A * B + C` on 16x16x16 signed-int8 tiles with i32 accumulation
/// (`v_wmma_i32_16x16x16_iu8 neg_lo:[1,1,0]`). Call with all 32 lanes active.
#[inline(always)]
pub fn wmma_i32_i8(a: [u32; 4], b: [u32; 4], c: [i32; 8]) -> [i32; 8] {
    // SAFETY: same-size plain-data transmutes; register-only intrinsic, called in wave-uniform
    // control flow with EXEC full.
    unsafe {
        let r = llvm_wmma_i32_iu8(
            true,
            core::mem::transmute::<[u32; 4], I32x4>(a),
            true,
            core::mem::transmute::<[u32; 4], I32x4>(b),
            core::mem::transmute::<[i32; 8], I32x8>(c),
            false,
        );
        core::mem::transmute::<I32x8, [i32; 8]>(r)
    }
}

/// `D = A * B + C` on 16x16x16 f16 tiles with f32 accumulation (`v_wmma_f32_16x16x16_f16`).
/// `a`/`b` are the 8 packed-half words of the lane's fragment. Call with all 32 lanes active.
#[inline(always)]
pub fn wmma_f32_f16(a: [u32; 8], b: [u32; 8], c: [f32; 8]) -> [f32; 8] {
    // SAFETY: same-size plain-data transmutes (32-byte vectors); the intrinsic is register-only
    // and every caller runs it in wave-uniform control flow with EXEC full.
    unsafe {
        let r = llvm_wmma_f32_f16(
            core::mem::transmute::<[u32; 8], F16x16>(a),
            core::mem::transmute::<[u32; 8], F16x16>(b),
            core::mem::transmute::<[f32; 8], F32x8>(c),
        );
        core::mem::transmute::<F32x8, [f32; 8]>(r)
    }
}

// ---- Cross-lane sum variants, measured by the `reduce_*` micro-benchmarks (docs/kernels.md,
// "Cross-lane reductions"). Every variant is the same xor butterfly (lane ^ 1, 2, 4, 8, 16 in
// that order), so all give bit-identical sums; they differ only in the instructions that move
// the values. Production code uses `XL_DPP_X16` (`group_sum_f32`, `wave_sum_i32`, ...).

/// DPP `row_xmask` 1, 2, 4, 8 (folded into `v_add_f32_dpp`) + `v_permlanex16_b32`.
pub const XL_DPP_X16: u32 = 1;
/// DPP `row_xmask` 1, 2, 4, 8 + `v_readlane_b32` of lanes 0 and 16 (scalar result).
pub const XL_DPP_READLANE: u32 = 2;
/// `v_permlane16_b32` (xor 1, 2, 4, 8 inside each row) + `v_permlanex16_b32`: no DPP.
pub const XL_PERMLANE: u32 = 3;
/// `ds_swizzle_b32` in bitmask mode, xor 1, 2, 4, 8, 16 (through the LDS unit).
pub const XL_SWIZZLE: u32 = 4;
/// `ds_bpermute_b32` from lane `lane ^ m` (through the LDS unit, address per lane).
pub const XL_BPERMUTE: u32 = 5;

/// `v_permlane16_b32` lane selects (low 8 lanes, high 8 lanes of a row) for `lane ^ m`.
const fn permlane_xor_sel(m: u32, high: bool) -> u32 {
    let mut v = 0u32;
    let mut i = 0;
    while i < 8 {
        let lane = i + if high { 8 } else { 0 };
        v |= ((lane ^ m) & 15) << (4 * i);
        i += 1;
    }
    v
}
#[inline(always)]
fn permlane_xor<const M: u32>(x: u32) -> u32 {
    // SAFETY: register-only; the selects are wave-uniform constants naming lanes of the same row.
    // Called in uniform control flow with all lanes active.
    unsafe {
        amdgpu::permlane16_u32::<false, false>(
            0,
            x,
            const { permlane_xor_sel(M, false) },
            const { permlane_xor_sel(M, true) },
        )
    }
}
#[inline(always)]
fn swizzle_xor<const M: u32>(x: u32) -> u32 {
    // SAFETY: ds_swizzle_b32 moves values between lanes through the LDS crossbar without
    // touching LDS memory; bitmask mode (bit 15 = 0), and_mask 0x1f, xor_mask M.
    unsafe { llvm_ds_swizzle(x as i32, (0x1f | (M << 10)) as i32) as u32 }
}
#[inline(always)]
fn bpermute_xor(x: u32, m: u32) -> u32 {
    // SAFETY: ds_bpermute_b32 reads lane `addr / 4 % 32` of `x` (register data through the LDS
    // crossbar, no LDS memory); all lanes are active.
    unsafe { amdgpu::ds_bpermute((lane_id() ^ m) << 2, x) }
}

/// Sum of `x` over the 32 lanes with cross-lane method `M` (`XL_*`); 0 = no reduction (the
/// benchmark's baseline). Every lane gets the sum except with `XL_DPP_READLANE`, whose result is
/// wave-uniform (computed from two scalars).
#[inline(always)]
pub fn wave_sum_f32_by<const M: u32>(x: f32) -> f32 {
    let f = f32::from_bits;
    match M {
        XL_DPP_X16 => group_sum_f32(x, 5),
        XL_DPP_READLANE => {
            let x = group_sum_f32(x, 4);
            f(read_lane(x.to_bits(), 0)) + f(read_lane(x.to_bits(), 16))
        }
        XL_PERMLANE => {
            let x = x + f(permlane_xor::<1>(x.to_bits()));
            let x = x + f(permlane_xor::<2>(x.to_bits()));
            let x = x + f(permlane_xor::<4>(x.to_bits()));
            let x = x + f(permlane_xor::<8>(x.to_bits()));
            x + f(swap_rows(x.to_bits()))
        }
        XL_SWIZZLE => {
            let x = x + f(swizzle_xor::<1>(x.to_bits()));
            let x = x + f(swizzle_xor::<2>(x.to_bits()));
            let x = x + f(swizzle_xor::<4>(x.to_bits()));
            let x = x + f(swizzle_xor::<8>(x.to_bits()));
            x + f(swizzle_xor::<16>(x.to_bits()))
        }
        XL_BPERMUTE => {
            let x = x + f(bpermute_xor(x.to_bits(), 1));
            let x = x + f(bpermute_xor(x.to_bits(), 2));
            let x = x + f(bpermute_xor(x.to_bits(), 4));
            let x = x + f(bpermute_xor(x.to_bits(), 8));
            x + f(bpermute_xor(x.to_bits(), 16))
        }
        _ => x,
    }
}

/// Workgroup barrier with workgroup-scope release/acquire fences: LDS (and global) writes
/// before it are visible to the whole workgroup after it. Call in uniform control flow.
#[inline(always)]
pub fn barrier() {
    // SAFETY: the shim only fences and executes s_barrier; every kernel calls it from
    // workgroup-uniform control flow, so no wave waits for one that never arrives.
    unsafe { strata_barrier_wg() }
}

/// The launch's dynamic LDS region. Offsets are in bytes.
///
/// Hardware clamps LDS accesses to the allocated size (out-of-range reads give 0, writes are
/// dropped), so no address outside the workgroup's LDS can be reached; the `unsafe` contract of
/// the accessors is about data races: between two barriers a byte is written by at most one
/// lane and not read by others.
#[derive(Clone, Copy)]
pub struct Lds {
    base: *mut u8,
}

#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct A16(u128);
#[repr(C, align(8))]
#[derive(Clone, Copy)]
struct A8(u64);

impl Lds {
    #[inline(always)]
    pub fn get() -> Lds {
        // SAFETY: returns a constant address (the LDS symbol); no side effects.
        Lds { base: unsafe { strata_lds_base() } }
    }
    /// The static table region (`abi::STATIC_TABLE_LDS_BYTES`), allocated in the kernels that
    /// use it, before the dynamic region.
    #[inline(always)]
    pub fn tables() -> Lds {
        // SAFETY: returns a constant address (the LDS symbol); no side effects.
        Lds { base: unsafe { strata_lds_tables_base() } }
    }
    /// Generic pointer to byte `off` of the region (for accesses the helpers below lack).
    #[inline(always)]
    pub fn ptr(self, off: u32) -> *mut u8 {
        self.base.wrapping_add(off as usize)
    }
    /// # Safety
    /// `off` is 16-byte aligned and inside the launch's LDS; no concurrent writer (see type doc).
    #[inline(always)]
    pub unsafe fn ld128(self, off: u32) -> [u32; 4] {
        // SAFETY: caller contract; A16 makes the access a single ds_load_b128.
        crate::mem::words4(unsafe { (*(self.base.add(off as usize) as *const A16)).0 })
    }
    /// # Safety
    /// As `ld128`, 8-byte aligned.
    #[inline(always)]
    pub unsafe fn ld64(self, off: u32) -> [u32; 2] {
        // SAFETY: caller contract.
        let v = unsafe { (*(self.base.add(off as usize) as *const A8)).0 };
        [v as u32, (v >> 32) as u32]
    }
    /// # Safety
    /// As `ld128`, 4-byte aligned.
    #[inline(always)]
    pub unsafe fn ld32(self, off: u32) -> u32 {
        // SAFETY: caller contract.
        unsafe { *(self.base.add(off as usize) as *const u32) }
    }
    /// # Safety
    /// 16-byte aligned, inside the LDS, and no other lane touches these bytes before the next
    /// barrier.
    #[inline(always)]
    pub unsafe fn st128(self, off: u32, v: [u32; 4]) {
        // SAFETY: caller contract.
        unsafe { *(self.base.add(off as usize) as *mut A16) = A16(crate::mem::join4(v)) }
    }
    /// # Safety
    /// As `st128`, 8-byte aligned.
    #[inline(always)]
    pub unsafe fn st64(self, off: u32, v: [u32; 2]) {
        // SAFETY: caller contract.
        unsafe { *(self.base.add(off as usize) as *mut A8) = A8(v[0] as u64 | (v[1] as u64) << 32) }
    }
    /// # Safety
    /// As `st128`, 4-byte aligned.
    #[inline(always)]
    pub unsafe fn st32(self, off: u32, v: u32) {
        // SAFETY: caller contract.
        unsafe { *(self.base.add(off as usize) as *mut u32) = v }
    }
}

/// Fused multiply-add `a * b + c` (one rounding, `v_fma_f32`/`v_fmac_f32`). Only for dot
/// products with a tolerance; never in the byte-exact quantizers.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    core::intrinsics::fmaf32(a, b, c)
}

/// Returns `x` unchanged but stops LLVM from fusing the operation that produced it with the
/// one that consumes it. Needed before f32 -> f16 conversions: LLVM folds
/// `fptrunc(a * b [+ c])` into `v_fma_mix*_f16`, which rounds once (the reference rounds to f32
/// first, then to f16) and turns `-0.0` products into `+0.0` (it adds +0).
#[inline(always)]
pub fn fp_fence(x: f32) -> f32 {
    // SAFETY: a pure value-preserving intrinsic (no code is emitted for it).
    unsafe { llvm_arithmetic_fence_f32(x) }
}

/// Round half away from zero (C `roundf`), as ggml's reference quantizers use.
#[inline(always)]
pub fn roundf(x: f32) -> f32 {
    core::intrinsics::roundf32(x)
}

/// Panic policy: `s_trap 2` so the queue reports an error. `loop {}` would hang the GPU and
/// `s_sethalt` lets LLVM delete the bounds check (it is declared `-> !` + willreturn).
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    core::intrinsics::abort()
}
