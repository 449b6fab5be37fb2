//! Cross-lane reduction micro-benchmarks: the same 32-lane f32 sum built from DPP +
//! `v_permlanex16_b32`, DPP + `v_readlane_b32`, `v_permlane16_b32` only, `ds_swizzle_b32` and
//! `ds_bpermute_b32` (`arch::wave_sum_f32_by`), so their instruction counts can be compared on
//! the software device and their ISA read (docs/kernels.md, "Cross-lane reductions").
//! Arguments: `abi::ReduceArgs`. Not used by the engine.
use super::unroll;
use crate::abi::{WAVES_PER_WG, reduce_kernels};
use crate::arch::{group_id, lane_id, wave_id, wave_sum_f32_by};

/// # Safety
/// `x` holds `n_waves * V * 32` f32, `y` holds `n_waves * V` f32 (abi::ReduceArgs).
#[inline(always)]
unsafe fn reduce_bench<const M: u32, const V: usize>(x: *const f32, y: *mut f32, n_waves: u32, reps: u32) {
    let wave = group_id() * WAVES_PER_WG + wave_id();
    if wave >= n_waves {
        return; // wave-uniform: the reductions below run with all lanes active
    }
    let lane = lane_id();
    let base = wave * V as u32;
    let mut v = [0f32; V];
    // SAFETY: value (base + j, lane) is inside `x` (caller contract).
    unroll::<V>(|j| v[j] = unsafe { *x.add(((base + j as u32) * 32 + lane) as usize) });
    let mut r = 0;
    while r < reps {
        unroll::<V>(|j| v[j] = wave_sum_f32_by::<M>(v[j]) * (1.0 / 32.0));
        r += 1;
    }
    if lane == 0 {
        // SAFETY: output base + j is inside `y`; one writer (lane 0 of this wave).
        unroll::<V>(|j| unsafe { *y.add((base + j as u32) as usize) = v[j] });
    }
}

macro_rules! define_reduce {
    ($($name:ident $m:literal $v:literal),* $(,)?) => {$(
        #[unsafe(no_mangle)]
        pub extern "gpu-kernel" fn $name(x: *const f32, y: *mut f32, n_waves: u32, reps: u32) {
            // SAFETY: the host launches per abi::ReduceArgs.
            unsafe { reduce_bench::<$m, $v>(x, y, n_waves, reps) }
        }
    )*};
}
reduce_kernels!(define_reduce);
