//! Kernels for the low-bit super-block formats against Q8_K activations: Q2_K, Q3_K, IQ4_XS,
//! IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M.
//!
//! Same shape as `fam_k`: decode 32 weights (shared by the NC columns), then per column
//! `isum += scale · Σ u8·i8` in i32 lanes, with a scale per 16 weights (`scale_vec`); once per
//! super-block the sums are converted and scaled by `d_w · d_x`. The u8 operand is
//! * the quant itself where it is unsigned (Q2_K; Q3_K's `q + 4`, its `−4` from the bsums);
//! * a grid magnitude with the sign moved onto the activation (IQ2, IQ3_S);
//! * `|w|` with `sign(x, w)` for signed values (IQ4_XS's levels; IQ1's `8·grid ± 1`, which
//!   carries the `±1/8` shift exactly, so the block sum is divided by 8 at the end).
//!
//! Every `u·x` pair sum stays below 2^15 (|u| ≤ 127, |x| ≤ 127), so `vpmaddubsw` is exact.

macro_rules! fam_lowbit {
    ($feat:literal) => {
        /// isum[c] += sc · Σ u·x over the 32 quants at `off` of column c0+c.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn lb_u<const NC: usize>(
            isum: &mut [__m256i; NC],
            u: __m256i,
            sv: __m256i,
            a: &Acts,
            c0: usize,
            k: usize,
            off: usize,
        ) {
            for c in 0..NC {
                let x = ld(a.qs.as_ptr().add((c0 + c) * k + off).cast());
                isum[c] = dps(isum[c], u, x, sv);
            }
        }

        /// [`lb_u`] with the activations negated where `neg` is 0xFF.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn lb_neg<const NC: usize>(
            isum: &mut [__m256i; NC],
            u: __m256i,
            neg: __m256i,
            sv: __m256i,
            a: &Acts,
            c0: usize,
            k: usize,
            off: usize,
        ) {
            for c in 0..NC {
                let x = ld(a.qs.as_ptr().add((c0 + c) * k + off).cast());
                isum[c] = dps(isum[c], u, _mm256_sub_epi8(_mm256_xor_si256(x, neg), neg), sv);
            }
        }

        /// [`lb_u`] for signed weights `w`: `|w|` times `x` with the sign of `w`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn lb_signed<const NC: usize>(
            isum: &mut [__m256i; NC],
            w: __m256i,
            sv: __m256i,
            a: &Acts,
            c0: usize,
            k: usize,
            off: usize,
        ) {
            let u = _mm256_abs_epi8(w);
            for c in 0..NC {
                let x = ld(a.qs.as_ptr().add((c0 + c) * k + off).cast());
                isum[c] = dps(isum[c], u, _mm256_sign_epi8(x, w), sv);
            }
        }

        /// acc[c] += dw · d_x · isum[c] for super-block `i`.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn lb_tail<const NC: usize>(
            acc: &mut [__m256; NC],
            isum: &[__m256i; NC],
            dw: f32,
            a: &Acts,
            c0: usize,
            nb: usize,
            i: usize,
        ) {
            for c in 0..NC {
                let da = *a.d.get_unchecked((c0 + c) * nb + i);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_set1_ps(dw * da), acc[c]);
            }
        }

        /// Σ_j v_j · bsums_j (16 i16 factors) per column, in i32 lanes.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn lb_bsum(v16: __m256i, a: &Acts, col: usize, nb: usize, i: usize) -> __m256i {
            _mm256_madd_epi16(ld(a.bsums.as_ptr().add((col * nb + i) * 16).cast()), v16)
        }

        /// 8 weights per u64 grid entry → 32 bytes.
        #[target_feature(enable = $feat)]
        #[inline]
        fn lb_grid64(g: &[u64], i0: usize, i1: usize, i2: usize, i3: usize) -> __m256i {
            let m = g.len() - 1; // the grids' sizes are powers of two
            _mm256_setr_epi64x(g[i0 & m] as i64, g[i1 & m] as i64, g[i2 & m] as i64, g[i3 & m] as i64)
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q2_k<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let m3 = _mm256_set1_epi8(3);
            let mut acc = [_mm256_setzero_ps(); NC];
            let mut accm = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 84);
                let sc = &*p.cast::<[u8; 16]>();
                let mut isum = [_mm256_setzero_si256(); NC];
                for h in 0..2 {
                    let v = ld(p.add(16 + 32 * h));
                    for s in 0..4 {
                        let u = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * s as i32)), m3);
                        let j = 8 * h + 2 * s;
                        let sv = scale_vec((sc[j] & 0xf) as i32, (sc[j + 1] & 0xf) as i32);
                        lb_u(&mut isum, u, sv, a, c0, k, i * 256 + 128 * h + 32 * s);
                    }
                }
                lb_tail(&mut acc, &isum, h2f(p.add(80)), a, c0, nb, i);
                let mins = _mm256_cvtepu8_epi16(_mm_srli_epi16(_mm_and_si128(ld128(p), _mm_set1_epi8(-16)), 4));
                let dmin = h2f(p.add(82));
                for c in 0..NC {
                    let da = *a.d.get_unchecked((c0 + c) * nb + i);
                    let mm = _mm256_cvtepi32_ps(lb_bsum(mins, a, c0 + c, nb, i));
                    accm[c] = _mm256_fmadd_ps(mm, _mm256_set1_ps(dmin * da), accm[c]);
                }
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]) - hsum(accm[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q3_k<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let m3 = _mm256_set1_epi8(3);
            let four = _mm256_set1_epi8(4);
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 110);
                let sc = crate::x86::common::q3k_scales(&*p.add(96).cast::<[u8; 12]>());
                let hm = ld(p);
                let mut isum = [_mm256_setzero_si256(); NC];
                for h in 0..2 {
                    let v = ld(p.add(32 + 32 * h));
                    for s in 0..4 {
                        let low = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * s as i32)), m3);
                        let bit = _mm256_set1_epi8((1u8 << (4 * h + s)) as i8);
                        let high = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
                        // q + 4 (0..7): a set hmask bit means no −4.
                        let u = _mm256_or_si256(low, _mm256_and_si256(high, four));
                        let j = 8 * h + 2 * s;
                        let sv = scale_vec(sc[j] as i32, sc[j + 1] as i32);
                        lb_u(&mut isum, u, sv, a, c0, k, i * 256 + 128 * h + 32 * s);
                    }
                }
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc.as_ptr().cast()));
                for c in 0..NC {
                    // Σ_j sc_j · 4 · bsum_j: the −4 that the u8 operand left out.
                    let bias = _mm256_slli_epi32(lb_bsum(sc16, a, c0 + c, nb, i), 2);
                    isum[c] = _mm256_sub_epi32(isum[c], bias);
                }
                lb_tail(&mut acc, &isum, h2f(p.add(108)), a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq4_xs<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let kv = _mm256_broadcastsi128_si256(ld128(crate::x86::tables::IQ4NL_VALUES.as_ptr().cast()));
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 136);
                let sh = u16::from_le_bytes([*p.add(2), *p.add(3)]);
                let sl = &*p.add(4).cast::<[u8; 4]>();
                let mut isum = [_mm256_setzero_si256(); NC];
                for g in 0..8 {
                    let v = _mm256_shuffle_epi8(kv, nibbles16(p.add(8 + 16 * g)));
                    let ls = quant::iq4_xs::scale_of(sh, sl, g);
                    lb_signed(&mut isum, v, scale_vec(ls, ls), a, c0, k, i * 256 + 32 * g);
                }
                lb_tail(&mut acc, &isum, h2f(p), a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq3_s<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let grid = &quant::grids::IQ3S_GRID;
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 110);
                let mut isum = [_mm256_setzero_si256(); NC];
                for g in 0..8 {
                    let qh = *p.add(66 + g) as usize;
                    let q = p.add(2 + 8 * g);
                    let ix = |t: usize| grid[(*q.add(t) as usize | (((qh >> t) & 1) << 8)) & 511] as i32;
                    let u = _mm256_setr_epi32(ix(0), ix(1), ix(2), ix(3), ix(4), ix(5), ix(6), ix(7));
                    let neg = bits(rd32(p.add(74 + 4 * g)));
                    let s = (*p.add(106 + g / 2) >> (4 * (g % 2))) & 0xf;
                    let ls = 1 + 2 * s as i32;
                    lb_neg(&mut isum, u, neg, scale_vec(ls, ls), a, c0, k, i * 256 + 32 * g);
                }
                lb_tail(&mut acc, &isum, h2f(p), a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq2_xxs<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let grid = &quant::grids::IQ2XXS_GRID[..];
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 66);
                let mut isum = [_mm256_setzero_si256(); NC];
                for g in 0..8 {
                    let ix = rd32(p.add(2 + 8 * g)) as usize;
                    let aux = rd32(p.add(6 + 8 * g));
                    let u = lb_grid64(grid, ix & 0xff, (ix >> 8) & 0xff, (ix >> 16) & 0xff, ix >> 24);
                    let ls = (2 * (aux >> 28) + 1) as i32;
                    lb_neg(&mut isum, u, bits(iq3_signs(aux)), scale_vec(ls, ls), a, c0, k, i * 256 + 32 * g);
                }
                lb_tail(&mut acc, &isum, h2f(p) * 0.125, a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq2_xs<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let grid = &quant::grids::IQ2XS_GRID[..];
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 74);
                let mut isum = [_mm256_setzero_si256(); NC];
                for g in 0..8 {
                    let q =
                        |l: usize| u16::from_le_bytes([*p.add(2 + 8 * g + 2 * l), *p.add(3 + 8 * g + 2 * l)]) as usize;
                    let (q0, q1, q2, q3) = (q(0), q(1), q(2), q(3));
                    let u = lb_grid64(grid, q0 & 511, q1 & 511, q2 & 511, q3 & 511);
                    let aux = ((q0 >> 9) | (q1 >> 9) << 7 | (q2 >> 9) << 14 | (q3 >> 9) << 21) as u32;
                    let sc = *p.add(66 + g);
                    let sv = scale_vec(2 * (sc & 0xf) as i32 + 1, 2 * (sc >> 4) as i32 + 1);
                    lb_neg(&mut isum, u, bits(iq3_signs(aux)), sv, a, c0, k, i * 256 + 32 * g);
                }
                lb_tail(&mut acc, &isum, h2f(p) * 0.125, a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq2_s<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let grid = &quant::grids::IQ2S_GRID[..];
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 82);
                let mut isum = [_mm256_setzero_si256(); NC];
                for g in 0..8 {
                    let qh = *p.add(66 + g) as usize;
                    let ix = |l: usize| *p.add(2 + 4 * g + l) as usize | (((qh >> (2 * l)) & 3) << 8);
                    let u = lb_grid64(grid, ix(0), ix(1), ix(2), ix(3));
                    let neg = bits(rd32(p.add(34 + 4 * g)));
                    let sc = *p.add(74 + g);
                    let sv = scale_vec(2 * (sc & 0xf) as i32 + 1, 2 * (sc >> 4) as i32 + 1);
                    lb_neg(&mut isum, u, neg, sv, a, c0, k, i * 256 + 32 * g);
                }
                lb_tail(&mut acc, &isum, h2f(p) * 0.125, a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq1_s<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let grid = &quant::grids::IQ1S_GRID[..];
            let eight = _mm256_set1_epi8(8);
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 50);
                let mut isum = [_mm256_setzero_si256(); NC];
                for g in 0..8 {
                    let qh = u16::from_le_bytes([*p.add(34 + 2 * g), *p.add(35 + 2 * g)]) as usize;
                    let ix = |l: usize| *p.add(2 + 4 * g + l) as usize | (((qh >> (3 * l)) & 7) << 8);
                    let gv = lb_grid64(grid, ix(0), ix(1), ix(2), ix(3));
                    let delta = _mm256_set1_epi8(if qh & 0x8000 != 0 { -1 } else { 1 });
                    let wv = _mm256_add_epi8(_mm256_sign_epi8(eight, gv), delta);
                    let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                    lb_signed(&mut isum, wv, scale_vec(ls, ls), a, c0, k, i * 256 + 32 * g);
                }
                lb_tail(&mut acc, &isum, h2f(p) * 0.125, a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq1_m<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let grid = &quant::grids::IQ1S_GRID[..];
            let eight = _mm256_set1_epi8(8);
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 56);
                let words = quant::iq1_m::scale_words(&*p.add(48).cast::<[u8; 8]>());
                let mut isum = [_mm256_setzero_si256(); NC];
                for g in 0..8 {
                    let nib = |l: usize| ((*p.add(32 + 2 * g + l / 2) >> (4 * (l % 2))) & 0xf) as usize;
                    let ix = |l: usize| *p.add(4 * g + l) as usize | ((nib(l) & 7) << 8);
                    let gv = lb_grid64(grid, ix(0), ix(1), ix(2), ix(3));
                    // The ±1/8 shift of each 8 weights, times 8, in every byte.
                    let dl = |l: usize| {
                        (if nib(l) & 8 != 0 { 0xffu64 } else { 1 }).wrapping_mul(0x0101_0101_0101_0101) as i64
                    };
                    let delta = _mm256_setr_epi64x(dl(0), dl(1), dl(2), dl(3));
                    let wv = _mm256_add_epi8(_mm256_sign_epi8(eight, gv), delta);
                    let sv = scale_vec(quant::iq1_m::ls(&words, 2 * g), quant::iq1_m::ls(&words, 2 * g + 1));
                    lb_signed(&mut isum, wv, sv, a, c0, k, i * 256 + 32 * g);
                }
                let d = quant::f16_to_f32(quant::iq1_m::d_bits_of(&words));
                lb_tail(&mut acc, &isum, d * 0.125, a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        rows_driver!($feat, rows_q2_k, dot_q2_k);
        rows_driver!($feat, rows_q3_k, dot_q3_k);
        rows_driver!($feat, rows_iq4_xs, dot_iq4_xs);
        rows_driver!($feat, rows_iq3_s, dot_iq3_s);
        rows_driver!($feat, rows_iq2_xxs, dot_iq2_xxs);
        rows_driver!($feat, rows_iq2_xs, dot_iq2_xs);
        rows_driver!($feat, rows_iq2_s, dot_iq2_s);
        rows_driver!($feat, rows_iq1_s, dot_iq1_s);
        rows_driver!($feat, rows_iq1_m, dot_iq1_m);
    };
}
