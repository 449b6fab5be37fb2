//! Helpers shared by both x86 paths (instantiated per path with its target features), and the
//! row × column-block driver.

/// Scalar/vector helpers: f16 conversion, horizontal sum, unaligned loads.
macro_rules! common_helpers {
    ($feat:literal) => {
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn h2f(p: *const u8) -> f32 {
            let h = u16::from_le_bytes([*p, *p.add(1)]);
            _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn rd32(p: *const u8) -> u32 {
            core::ptr::read_unaligned(p.cast::<u32>())
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld(p: *const u8) -> __m256i {
            _mm256_loadu_si256(p.cast())
        }
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn ld128(p: *const u8) -> __m128i {
            _mm_loadu_si128(p.cast())
        }
        #[target_feature(enable = $feat)]
        #[inline]
        fn hsum(v: __m256) -> f32 {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
            _mm_cvtss_f32(s)
        }
        /// 4 bit nibbles of 16 bytes → 32 bytes: low nibbles first, then high nibbles
        /// (the Q4_0/Q5_0/IQ4_NL element order).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn nibbles16(p: *const u8) -> __m256i {
            let q = ld128(p);
            let m = _mm_set1_epi8(0x0F);
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), m), _mm_and_si128(q, m))
        }
        /// Sign bits of IQ3_XXS: 4 × 7-bit indices in `aux` (bits 0..28) → 32 sign bits.
        /// The 8th bit of each byte is the parity of its 7 bits (ggml's `ksigns_iq2xs` table
        /// stores exactly that), computed here by folding instead of a table lookup.
        #[target_feature(enable = $feat)]
        #[inline]
        fn iq3_signs(aux: u32) -> u32 {
            let s7 = _pdep_u32(aux, 0x7F7F_7F7F);
            let mut p = s7 ^ (s7 >> 4);
            p ^= p >> 2;
            p ^= p >> 1;
            s7 | ((p & 0x0101_0101) << 7)
        }
    };
}

/// Generates `pub(crate) unsafe fn $name: RowsFn` calling `$dot::<NC>` on each row for
/// column groups of 4 (then 3/2/1), columns blocked by `col_block` so activations stay in L2.
macro_rules! rows_driver {
    ($feat:literal, $name:ident, $dot:ident) => {
        rows_driver!($feat, $name, $dot, 4);
    };
    ($feat:literal, $name:ident, $dot:ident, $tile:literal) => {
        #[target_feature(enable = $feat)]
        pub(crate) unsafe fn $name(w: &QTensor, rb: usize, a: &Acts, r0: usize, r1: usize, y: *mut f32) {
            let rows = w.rows;
            let n = a.n;
            let esz = match a.ty {
                quant::GgmlType::F32 => 4,
                quant::GgmlType::F16 | quant::GgmlType::BF16 => 2,
                _ => 1,
            };
            let col_block = crate::x86::common::col_block(w.cols, esz);
            // Rows in groups of ~384 KiB of weights: a group stays in L2 while every column
            // block streams past it, so weights come from memory once per task, activations
            // once per row group (from L3).
            let sub_rows = ((384usize << 10) / rb.max(1)).max(4);
            let mut rs = r0;
            while rs < r1 {
                let re = (rs + sub_rows).min(r1);
                let mut cb = 0;
                while cb < n {
                    let ce = (cb + col_block).min(n);
                    for r in rs..re {
                        let wp = w.data.as_ptr().add(r * rb);
                        if n == 1 {
                            crate::x86::common::prefetch_ahead(wp, rb);
                        }
                        let mut c = cb;
                        // Wide tiles (8 columns) for kernels whose weight decode is expensive.
                        while $tile == 8 && c + 8 <= ce {
                            let v = $dot::<8>(wp, w.cols, a, c);
                            for (i, v) in v.iter().enumerate() {
                                *y.add((c + i) * rows + r) = *v;
                            }
                            c += 8;
                        }
                        while c + 4 <= ce {
                            let v = $dot::<4>(wp, w.cols, a, c);
                            for (i, v) in v.iter().enumerate() {
                                *y.add((c + i) * rows + r) = *v;
                            }
                            c += 4;
                        }
                        match ce - c {
                            3 => {
                                let v = $dot::<3>(wp, w.cols, a, c);
                                for (i, v) in v.iter().enumerate() {
                                    *y.add((c + i) * rows + r) = *v;
                                }
                            }
                            2 => {
                                let v = $dot::<2>(wp, w.cols, a, c);
                                for (i, v) in v.iter().enumerate() {
                                    *y.add((c + i) * rows + r) = *v;
                                }
                            }
                            1 => {
                                let v = $dot::<1>(wp, w.cols, a, c);
                                *y.add(c * rows + r) = v[0];
                            }
                            _ => {}
                        }
                    }
                    cb = ce;
                }
                rs = re;
            }
        }
    };
}

/// Weight type → this path's `rows_*` function.
macro_rules! kernel_table {
    ($ty:expr) => {
        match $ty {
            GgmlType::Q8_0 => Some(rows_q8_0 as RowsFn),
            GgmlType::Q4_0 => Some(rows_q4_0 as RowsFn),
            GgmlType::Q4_1 => Some(rows_q4_1 as RowsFn),
            GgmlType::Q5_0 => Some(rows_q5_0 as RowsFn),
            GgmlType::Q5_1 => Some(rows_q5_1 as RowsFn),
            GgmlType::IQ4NL => Some(rows_iq4_nl as RowsFn),
            GgmlType::Q4K => Some(rows_q4_k as RowsFn),
            GgmlType::Q5K => Some(rows_q5_k as RowsFn),
            GgmlType::Q6K => Some(rows_q6_k as RowsFn),
            GgmlType::IQ3XXS => Some(rows_iq3_xxs as RowsFn),
            GgmlType::F32 => Some(rows_f32 as RowsFn),
            GgmlType::F16 => Some(rows_f16 as RowsFn),
            GgmlType::BF16 => Some(rows_bf16 as RowsFn),
            GgmlType::Q2K => Some(rows_q2_k as RowsFn),
            GgmlType::Q3K => Some(rows_q3_k as RowsFn),
            GgmlType::IQ4XS => Some(rows_iq4_xs as RowsFn),
            GgmlType::IQ3S => Some(rows_iq3_s as RowsFn),
            GgmlType::IQ2XXS => Some(rows_iq2_xxs as RowsFn),
            GgmlType::IQ2XS => Some(rows_iq2_xs as RowsFn),
            GgmlType::IQ2S => Some(rows_iq2_s as RowsFn),
            GgmlType::IQ1S => Some(rows_iq1_s as RowsFn),
            GgmlType::IQ1M => Some(rows_iq1_m as RowsFn),
            _ => None,
        }
    };
}
