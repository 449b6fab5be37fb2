//! Kernels for the 32-element block formats against Q8_0 / Q8_1 activations:
//! Q8_0, Q4_0, Q5_0, IQ4_NL (signed weights; `|w| · sign(x, w)` makes the u8×i8 product
//! exact — the activations are in [-127, 127] so negating them never overflows) and
//! Q4_1, Q5_1 (unsigned weights `q`, value `d·q + m`; the `m` term uses Q8_1's stored s).

macro_rules! fam_q8 {
    ($feat:literal) => {
        /// acc[c] += dw · d_x · Σ w·x over block `b` (signed weights `wq`).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn blk_signed<const NC: usize>(
            acc: &mut [__m256; NC],
            wq: __m256i,
            dw: f32,
            a: &Acts,
            c0: usize,
            k: usize,
            b: usize,
        ) {
            let aw = _mm256_abs_epi8(wq);
            let nb = k / 32;
            for c in 0..NC {
                let col = c0 + c;
                let x = ld(a.qs.as_ptr().add(col * k + b * 32).cast());
                let p = dp(_mm256_setzero_si256(), aw, _mm256_sign_epi8(x, wq));
                let d = _mm256_set1_ps(dw * *a.d.get_unchecked(col * nb + b));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc[c]);
            }
        }

        /// acc[c] += dw · d_x · Σ q·x, macc[c] += m · s_x over block `b` (unsigned weights).
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn blk_unsigned<const NC: usize>(
            acc: &mut [__m256; NC],
            macc: &mut [f32; NC],
            wq: __m256i,
            dw: f32,
            m: f32,
            a: &Acts,
            c0: usize,
            k: usize,
            b: usize,
        ) {
            let nb = k / 32;
            for c in 0..NC {
                let col = c0 + c;
                let x = ld(a.qs.as_ptr().add(col * k + b * 32).cast());
                let p = dp(_mm256_setzero_si256(), wq, x);
                let d = _mm256_set1_ps(dw * *a.d.get_unchecked(col * nb + b));
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc[c]);
                macc[c] += m * *a.s.get_unchecked(col * nb + b);
            }
        }

        #[target_feature(enable = $feat)]
        #[inline]
        fn finish<const NC: usize>(acc: [__m256; NC]) -> [f32; NC] {
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q8_0<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let mut acc = [_mm256_setzero_ps(); NC];
            for b in 0..k / 32 {
                let p = w.add(b * 34);
                blk_signed(&mut acc, ld(p.add(2)), h2f(p), a, c0, k, b);
            }
            finish(acc)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q4_0<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let mut acc = [_mm256_setzero_ps(); NC];
            for b in 0..k / 32 {
                let p = w.add(b * 18);
                let wq = _mm256_sub_epi8(nibbles16(p.add(2)), _mm256_set1_epi8(8));
                blk_signed(&mut acc, wq, h2f(p), a, c0, k, b);
            }
            finish(acc)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q5_0<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let mut acc = [_mm256_setzero_ps(); NC];
            for b in 0..k / 32 {
                let p = w.add(b * 22);
                // Bit i of qh is the 5th bit of element i.
                let hb = _mm256_and_si256(bits(rd32(p.add(2))), _mm256_set1_epi8(0x10));
                let wq = _mm256_sub_epi8(_mm256_or_si256(nibbles16(p.add(6)), hb), _mm256_set1_epi8(16));
                blk_signed(&mut acc, wq, h2f(p), a, c0, k, b);
            }
            finish(acc)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq4_nl<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let kv = _mm256_broadcastsi128_si256(ld128(crate::x86::tables::IQ4NL_VALUES.as_ptr().cast()));
            let mut acc = [_mm256_setzero_ps(); NC];
            for b in 0..k / 32 {
                let p = w.add(b * 18);
                let wq = _mm256_shuffle_epi8(kv, nibbles16(p.add(2)));
                blk_signed(&mut acc, wq, h2f(p), a, c0, k, b);
            }
            finish(acc)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q4_1<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let mut acc = [_mm256_setzero_ps(); NC];
            let mut macc = [0f32; NC];
            for b in 0..k / 32 {
                let p = w.add(b * 20);
                blk_unsigned(&mut acc, &mut macc, nibbles16(p.add(4)), h2f(p), h2f(p.add(2)), a, c0, k, b);
            }
            let mut out = finish(acc);
            for c in 0..NC {
                out[c] += macc[c];
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q5_1<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let mut acc = [_mm256_setzero_ps(); NC];
            let mut macc = [0f32; NC];
            for b in 0..k / 32 {
                let p = w.add(b * 24);
                let hb = _mm256_and_si256(bits(rd32(p.add(4))), _mm256_set1_epi8(0x10));
                let wq = _mm256_or_si256(nibbles16(p.add(8)), hb);
                blk_unsigned(&mut acc, &mut macc, wq, h2f(p), h2f(p.add(2)), a, c0, k, b);
            }
            let mut out = finish(acc);
            for c in 0..NC {
                out[c] += macc[c];
            }
            out
        }

        rows_driver!($feat, rows_q8_0, dot_q8_0);
        rows_driver!($feat, rows_q4_0, dot_q4_0);
        rows_driver!($feat, rows_q5_0, dot_q5_0);
        rows_driver!($feat, rows_iq4_nl, dot_iq4_nl);
        rows_driver!($feat, rows_q4_1, dot_q4_1);
        rows_driver!($feat, rows_q5_1, dot_q5_1);
    };
}
