//! AVX2 activation quantizers (the SIMD halves of `prepare::quantize_q8_k` and
//! `prepare::quantize_q8_0_x86`, which check the CPU features and hold the scalar definitions).

/// One Q8_K block like `quant::q8_k::quantize_ref`: amax and the first value reaching it,
/// `iscale = -127/max`, quants `nearest_int(iscale·x)` (round half to even), `d = 1/iscale`,
/// sums of 16. Returns false (nothing written) if the block holds a NaN or an infinity.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(unsafe_op_in_unsafe_fn)]
pub(crate) unsafe fn quantize_q8_k_block_avx2(x: &[f32], out: &mut [u8]) -> bool {
    use core::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    let inf = _mm256_set1_ps(f32::INFINITY);
    let mut m = _mm256_setzero_ps();
    let mut bad = _mm256_setzero_ps();
    for i in 0..32 {
        let a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x.as_ptr().add(8 * i)));
        m = _mm256_max_ps(m, a);
        // NaN (unordered) or |x| == inf
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_NLT_UQ>(a, inf));
    }
    if _mm256_movemask_ps(bad) != 0 {
        return false;
    }
    let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if amax == 0.0 {
        out.fill(0);
        return true;
    }
    let first = x.iter().position(|v| v.abs() == amax).expect("amax is one of the values");
    let max = x[first];
    let iscale = -127.0 / max;
    let mul = _mm256_set1_ps(iscale);
    let c127 = _mm256_set1_epi32(127);
    let mut q = [0i8; 256];
    for i in 0..8 {
        let v: [__m256i; 4] = core::array::from_fn(|j| {
            let p = _mm256_mul_ps(mul, _mm256_loadu_ps(x.as_ptr().add(32 * i + 8 * j)));
            _mm256_min_epi32(_mm256_cvtps_epi32(p), c127)
        });
        let p8 = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
        let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(q.as_mut_ptr().add(32 * i).cast(), p8);
    }
    out[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (o, &v) in out[4..260].iter_mut().zip(&q) {
        *o = v as u8;
    }
    for k in 0..16 {
        let s: i32 = q[16 * k..16 * k + 16].iter().map(|&v| v as i32).sum();
        out[260 + 2 * k..262 + 2 * k].copy_from_slice(&(s as i16).to_le_bytes());
    }
    true
}

/// `prepare::quantize_q8_0_x86` as ggml's AVX2 code does it (max of |x| in 8 lanes, `vmulps`,
/// `vroundps` to nearest even, `vcvtps2dq`): the same values for every non-NaN input.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(unsafe_op_in_unsafe_fn)]
pub(crate) unsafe fn quantize_q8_0_x86_avx2(x: &[f32], out: &mut [u8]) {
    use core::arch::x86_64::*;
    let sign = _mm256_set1_ps(-0.0);
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(34)) {
        let v: [__m256; 4] = core::array::from_fn(|i| _mm256_loadu_ps(xb.as_ptr().add(8 * i)));
        let m = v.iter().fold(_mm256_setzero_ps(), |m, &x| _mm256_max_ps(m, _mm256_andnot_ps(sign, x)));
        let m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
        let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        ob[..2].copy_from_slice(&quant::f32_to_f16(d).to_le_bytes());
        let mul = _mm256_set1_ps(id);
        let q: [__m256i; 4] = core::array::from_fn(|i| {
            _mm256_cvtps_epi32(_mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
                v[i], mul,
            )))
        });
        // Pack to i8 with saturation (values are within [-127, 127]) and undo the lane interleave.
        let p16a = _mm256_packs_epi32(q[0], q[1]);
        let p16b = _mm256_packs_epi32(q[2], q[3]);
        let p8 = _mm256_packs_epi16(p16a, p16b);
        let p8 = _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(ob.as_mut_ptr().add(2).cast(), p8);
    }
}
