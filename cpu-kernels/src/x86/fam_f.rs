//! Float weight kernels: F32 × f32, F16 × f16 (F16C conversion), BF16 × bf16 (exact shift to
//! f32). All accumulate in f32 with two FMA chains per column; any row length (scalar tail).

macro_rules! fam_f {
    ($feat:literal) => {
        /// Loads 8 weights/activations of the float type `$t` as f32.
        macro_rules! f_dot {
            ($name:ident, $load:ident, $one:ident, $esz:expr, $act:ident) => {
                #[target_feature(enable = $feat)]
                #[inline]
                unsafe fn $name<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
                    let mut acc0 = [_mm256_setzero_ps(); NC];
                    let mut acc1 = [_mm256_setzero_ps(); NC];
                    let mut i = 0;
                    while i + 16 <= k {
                        let w0 = $load(w.add(i * $esz));
                        let w1 = $load(w.add((i + 8) * $esz));
                        for c in 0..NC {
                            let x = a.$act.as_ptr().add((c0 + c) * k + i).cast::<u8>();
                            acc0[c] = _mm256_fmadd_ps(w0, $load(x), acc0[c]);
                            acc1[c] = _mm256_fmadd_ps(w1, $load(x.add(8 * $esz)), acc1[c]);
                        }
                        i += 16;
                    }
                    let mut out = [0f32; NC];
                    for c in 0..NC {
                        let mut s = hsum(_mm256_add_ps(acc0[c], acc1[c]));
                        let x = a.$act.as_ptr().add((c0 + c) * k).cast::<u8>();
                        for j in i..k {
                            s += $one(w.add(j * $esz)) * $one(x.add(j * $esz));
                        }
                        out[c] = s;
                    }
                    out
                }
            };
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld_f32(p: *const u8) -> __m256 {
            _mm256_loadu_ps(p.cast())
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn one_f32(p: *const u8) -> f32 {
            core::ptr::read_unaligned(p.cast::<f32>())
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld_f16(p: *const u8) -> __m256 {
            _mm256_cvtph_ps(ld128(p))
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld_bf16(p: *const u8) -> __m256 {
            // bf16 is the top half of an f32: widening and shifting by 16 is exact.
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(ld128(p)), 16))
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn one_bf16(p: *const u8) -> f32 {
            f32::from_bits((u16::from_le_bytes([*p, *p.add(1)]) as u32) << 16)
        }

        f_dot!(dot_f32, ld_f32, one_f32, 4, f);
        f_dot!(dot_f16, ld_f16, h2f, 2, h);
        f_dot!(dot_bf16, ld_bf16, one_bf16, 2, h);

        rows_driver!($feat, rows_f32, dot_f32);
        rows_driver!($feat, rows_f16, dot_f16);
        rows_driver!($feat, rows_bf16, dot_bf16);
    };
}
