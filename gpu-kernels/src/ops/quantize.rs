//! Activation quantization f32 → Q8_1 (the MMVQ activation format) and f32 → Q8_K (the
//! activation format of the CPU K-quant/IQ dot products), byte-exact with `quant`'s
//! `quantize_ref`: the same scalar helpers (`fabsf`, `roundf_i32`, `nearest_int`) are compiled
//! here, the divisions are IEEE (`v_div_scale/fmas/fixup`), and nothing is contracted into an
//! FMA (Rust never contracts; the ISA test checks `v_mul_f32` feeds `v_add_f32` in Q8_K).
use crate::abi::{Q8_1_BYTES, Q8_K_BYTES, QK_K, QK8_1, WAVES_PER_WG, WG_SIZE};
use crate::arch::{
    group_id, lane_id, read_lane, thread_id, wave_id, wave_max_u32, wave_min_u32, wave_sum_i32, xor1_i32,
};
use crate::mem::{f32_to_f16, ld_f32x4_aligned, st_u16, st_u32, st_u32x2};
use quant::util::{fabsf, nearest_int, roundf_i32};

/// One Q8_1 block per work-item: `d = amax/127`, `q = roundf(x/d)`, `s = f16(sum(q) * d)`.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn quantize_q8_1(x: *const f32, y: *mut u8, n: u32, _pad: u32) {
    let b = group_id() * WG_SIZE + thread_id();
    if b >= n / QK8_1 {
        return;
    }
    // SAFETY: ABI (abi::QuantizeArgs): `x` holds `n` f32 and is 16-byte aligned, `y` holds
    // `n / 32` 36-byte blocks and is 4-byte aligned; block `b` is this work-item's alone.
    unsafe { quantize_block_q8_1(x.add((b * QK8_1) as usize), y.add((b * Q8_1_BYTES) as usize)) }
}

/// # Safety
/// `src` = 32 readable f32 (16-byte aligned), `dst` = 36 writable bytes (4-byte aligned).
#[inline(always)]
unsafe fn quantize_block_q8_1(src: *const f32, dst: *mut u8) {
    let mut v = [0f32; 32];
    for i in 0..8 {
        // SAFETY: caller contract (8 x 16 bytes inside the block).
        let q = unsafe { ld_f32x4_aligned(src.add(4 * i)) };
        v[4 * i..4 * i + 4].copy_from_slice(&q);
    }
    let mut amax = 0.0f32;
    for &x in &v {
        let a = fabsf(x);
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut words = [0u32; 8];
    let mut sum = 0i32;
    for j in 0..32 {
        let q = roundf_i32(v[j] * id) as i8;
        sum += q as i32;
        words[j / 4] |= (q as u8 as u32) << (8 * (j % 4));
    }
    let head = f32_to_f16(d) as u32 | (f32_to_f16(sum as f32 * d) as u32) << 16;
    // SAFETY: caller contract (36 bytes at dst, 4-byte aligned).
    unsafe {
        st_u32(dst, head);
        st_u32x2(dst.add(4), [words[0], words[1]]);
        st_u32x2(dst.add(12), [words[2], words[3]]);
        st_u32x2(dst.add(20), [words[4], words[5]]);
        st_u32x2(dst.add(28), [words[6], words[7]]);
    }
}

/// The Q8_1 block of 32 values held one per lane of a wave (lane `l` holds value `l`), written
/// to `dst` with the bytes of `quantize_block_q8_1`: the amax by a wave max of the magnitudes'
/// bits (exact), `d`, `1/d` and each lane's rounding as there, the quant sum by a wave sum of
/// integers (exact). Lane `l` stores quant byte `l`, lane 0 the scales. For kernels whose output
/// is the next product's input: the fused quantization saves a launch.
///
/// # Safety
/// Every lane of the wave is active and passes the same `dst`: 36 writable bytes, 4-byte
/// aligned.
#[inline(always)]
pub(crate) unsafe fn quantize_wave_q8_1(v: f32, dst: *mut u8) {
    let amax = f32::from_bits(wave_max_u32(fabsf(v).to_bits()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q = roundf_i32(v * id) as i8;
    let sum = wave_sum_i32(q as i32);
    let lane = lane_id();
    // SAFETY: caller contract; lane l alone writes byte 4 + l, lane 0 the first 4 bytes.
    unsafe {
        *dst.add(4 + lane as usize) = q as u8;
        if lane == 0 {
            st_u32(dst, f32_to_f16(d) as u32 | (f32_to_f16(sum as f32 * d) as u32) << 16);
        }
    }
}

/// One Q8_K block (256 values) per wave, 8 values per lane. The reference picks `max` = the
/// first value of largest magnitude; the wave finds the magnitude (max reduction), then the
/// smallest index holding it (min reduction), then reads that lane's value.
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn quantize_q8_k(x: *const f32, y: *mut u8, n: u32, _pad: u32) {
    let b = group_id() * WAVES_PER_WG + wave_id();
    if b >= n / QK_K {
        return; // wave-uniform
    }
    // SAFETY: ABI (abi::QuantizeArgs): `x` holds `n` f32 (16-byte aligned), `y` holds `n/256`
    // 292-byte blocks (4-byte aligned); block `b` belongs to this wave, and each lane writes
    // distinct bytes of it.
    unsafe { quantize_block_q8_k(x.add((b * QK_K) as usize), y.add((b * Q8_K_BYTES) as usize)) }
}

/// # Safety
/// `src` = 256 readable f32 (16-byte aligned), `dst` = 292 writable bytes (4-byte aligned);
/// called by all 32 lanes of a wave.
#[inline(always)]
unsafe fn quantize_block_q8_k(src: *const f32, dst: *mut u8) {
    let lane = lane_id();
    // SAFETY: caller contract; lane reads values 8*lane .. 8*lane+8.
    let (a, b) =
        unsafe { (ld_f32x4_aligned(src.add(8 * lane as usize)), ld_f32x4_aligned(src.add(8 * lane as usize + 4))) };
    let v = [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]];
    let mut amax_l = 0.0f32;
    let mut first = 0u32;
    let mut mine = 0.0f32;
    for (j, &x) in v.iter().enumerate() {
        let ax = fabsf(x);
        if ax > amax_l {
            amax_l = ax;
            first = j as u32;
            mine = x;
        }
    }
    let amax = f32::from_bits(wave_max_u32(amax_l.to_bits()));
    if amax == 0.0 {
        // SAFETY: caller contract; lane writes its 8 quants, even lanes one bsum, lane 0 d.
        unsafe {
            st_u32x2(dst.add(4 + 8 * lane as usize), [0, 0]);
            if lane & 1 == 0 {
                st_u16(dst.add(260 + lane as usize), 0);
            }
            if lane == 0 {
                st_u32(dst, 0);
            }
        }
        return;
    }
    let cand = if amax_l == amax { lane * 8 + first } else { u32::MAX };
    let idx = wave_min_u32(cand);
    let max = f32::from_bits(read_lane(mine.to_bits(), idx >> 3));
    let iscale = -127.0 / max;
    let mut words = [0u32; 2];
    let mut sum = 0i32;
    for (j, &x) in v.iter().enumerate() {
        let q = nearest_int(iscale * x).min(127) as i8;
        sum += q as i32;
        words[j / 4] |= (q as u8 as u32) << (8 * (j % 4));
    }
    // bsums[g] = quants 16g..16g+16 = lanes 2g and 2g+1.
    let pair = sum + xor1_i32(sum);
    let d = 1.0 / iscale;
    // SAFETY: caller contract; distinct bytes per lane as above.
    unsafe {
        st_u32x2(dst.add(4 + 8 * lane as usize), words);
        if lane & 1 == 0 {
            st_u16(dst.add(260 + lane as usize), pair as i16 as u16);
        }
        if lane == 0 {
            st_u32(dst, d.to_bits());
        }
    }
}
