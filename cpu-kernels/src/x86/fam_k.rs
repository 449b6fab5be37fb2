//! Kernels for the 256-element super-block formats against Q8_K activations: Q4_K, Q5_K,
//! Q6_K and IQ3_XXS (grid gathered with scalar loads; the AVX-512 VBMI kernel is `iq3_512`).
//!
//! Shape of every kernel: decode one group of 32 weights to u8 (shared by the NC columns),
//! then per column `isum += scale · Σ u8·i8` in i32 lanes; per super-block the i32 sums are
//! converted once and scaled by `d_w · d_x`. Offsets that do not depend on the weights'
//! low bits (Q4_K/Q5_K mins, Q6_K's -32) come from the Q8_K `bsums` (sums of 16 quants).

macro_rules! fam_k {
    ($feat:literal) => {
        /// The Q4_K/Q5_K tail: converts the per-column sums of one super-block.
        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn k_mins<const NC: usize>(
            acc: &mut [__m256; NC],
            accm: &mut [__m256; NC],
            isum: &[__m256i; NC],
            d: f32,
            dmin: f32,
            mn: &[u8; 8],
            a: &Acts,
            c0: usize,
            nb: usize,
            i: usize,
        ) {
            let mut m16 = [0i16; 16];
            for (j, v) in m16.iter_mut().enumerate() {
                *v = mn[j / 2] as i16;
            }
            let mins16 = ld(m16.as_ptr().cast());
            for c in 0..NC {
                let col = c0 + c;
                let da = *a.d.get_unchecked(col * nb + i);
                acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_set1_ps(d * da), acc[c]);
                let bs = ld(a.bsums.as_ptr().add((col * nb + i) * 16).cast());
                let mm = _mm256_madd_epi16(bs, mins16);
                accm[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mm), _mm256_set1_ps(dmin * da), accm[c]);
            }
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q4_k<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let m4 = _mm256_set1_epi8(0x0F);
            let mut acc = [_mm256_setzero_ps(); NC];
            let mut accm = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 144);
                let (sc, mn) = crate::x86::common::k4_scales(&*p.add(4).cast::<[u8; 12]>());
                let mut isum = [_mm256_setzero_si256(); NC];
                for j in 0..4 {
                    let v = ld(p.add(16 + 32 * j));
                    let lo = _mm256_and_si256(v, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                    let s0 = scale_vec(sc[2 * j] as i32, sc[2 * j] as i32);
                    let s1 = scale_vec(sc[2 * j + 1] as i32, sc[2 * j + 1] as i32);
                    for c in 0..NC {
                        let xq = a.qs.as_ptr().add((c0 + c) * k + i * 256 + 64 * j).cast::<u8>();
                        isum[c] = dps(isum[c], lo, ld(xq), s0);
                        isum[c] = dps(isum[c], hi, ld(xq.add(32)), s1);
                    }
                }
                k_mins(&mut acc, &mut accm, &isum, h2f(p), h2f(p.add(2)), &mn, a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]) - hsum(accm[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q5_k<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let m4 = _mm256_set1_epi8(0x0F);
            let b4 = _mm256_set1_epi8(0x10);
            let mut acc = [_mm256_setzero_ps(); NC];
            let mut accm = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 176);
                let (sc, mn) = crate::x86::common::k4_scales(&*p.add(4).cast::<[u8; 12]>());
                let qh = ld(p.add(16));
                let mut isum = [_mm256_setzero_si256(); NC];
                for j in 0..4 {
                    let v = ld(p.add(48 + 32 * j));
                    // Sub-block 2j takes its 5th bit from bit 2j of qh[l], 2j+1 from bit 2j+1.
                    let ml = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
                    let mh = _mm256_set1_epi8((1u8 << (2 * j + 1)) as i8);
                    let hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, ml), ml), b4);
                    let hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, mh), mh), b4);
                    let lo = _mm256_or_si256(_mm256_and_si256(v, m4), hl);
                    let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), hh);
                    let s0 = scale_vec(sc[2 * j] as i32, sc[2 * j] as i32);
                    let s1 = scale_vec(sc[2 * j + 1] as i32, sc[2 * j + 1] as i32);
                    for c in 0..NC {
                        let xq = a.qs.as_ptr().add((c0 + c) * k + i * 256 + 64 * j).cast::<u8>();
                        isum[c] = dps(isum[c], lo, ld(xq), s0);
                        isum[c] = dps(isum[c], hi, ld(xq.add(32)), s1);
                    }
                }
                k_mins(&mut acc, &mut accm, &isum, h2f(p), h2f(p.add(2)), &mn, a, c0, nb, i);
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]) - hsum(accm[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_q6_k<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let m4 = _mm256_set1_epi8(0x0F);
            let m30 = _mm256_set1_epi8(0x30);
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 210);
                let scp = p.add(192).cast::<i8>();
                let mut isum = [_mm256_setzero_si256(); NC];
                for h in 0..2 {
                    let ql0 = ld(p.add(64 * h));
                    let ql1 = ld(p.add(64 * h + 32));
                    let qh = ld(p.add(128 + 32 * h));
                    // 6-bit quants 0..63 (value = q - 32; the -32 is applied through bsums).
                    let q = [
                        _mm256_or_si256(
                            _mm256_and_si256(ql0, m4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(3)), 4),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(ql1, m4),
                            _mm256_slli_epi16(_mm256_and_si256(qh, _mm256_set1_epi8(12)), 2),
                        ),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30)),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
                        ),
                    ];
                    for (v, &qv) in q.iter().enumerate() {
                        let g = 8 * h + 2 * v; // scale of the first 16 weights of this vector
                        let sv = scale_vec(*scp.add(g) as i32, *scp.add(g + 1) as i32);
                        for c in 0..NC {
                            let xq = a.qs.as_ptr().add((c0 + c) * k + i * 256 + 128 * h + 32 * v).cast::<u8>();
                            isum[c] = dps(isum[c], qv, ld(xq), sv);
                        }
                    }
                }
                let sc16 = _mm256_cvtepi8_epi16(ld128(scp.cast()));
                let d = h2f(p.add(208));
                for c in 0..NC {
                    let col = c0 + c;
                    let bs = ld(a.bsums.as_ptr().add((col * nb + i) * 16).cast());
                    // Σ_g sc_g · 32 · bsum_g: the "-32" offset of every 6-bit quant.
                    let bias = _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5);
                    let t = _mm256_sub_epi32(isum[c], bias);
                    let da = *a.d.get_unchecked(col * nb + i);
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_set1_ps(d * da), acc[c]);
                }
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        #[target_feature(enable = $feat)]
        #[inline]
        unsafe fn dot_iq3_xxs<const NC: usize>(w: *const u8, k: usize, a: &Acts, c0: usize) -> [f32; NC] {
            let nb = k / 256;
            let grid = crate::x86::tables::iq3xxs_grid();
            let mut acc = [_mm256_setzero_ps(); NC];
            for i in 0..nb {
                let p = w.add(i * 98);
                let qs = p.add(2);
                let mut isum = [_mm256_setzero_si256(); NC];
                for s in 0..8 {
                    let aux = rd32(p.add(66 + 4 * s));
                    let q = qs.add(8 * s);
                    // Magnitudes (4..62) of 32 weights: 8 grid entries of 4 bytes each.
                    let g = _mm256_setr_epi32(
                        grid[*q as usize] as i32,
                        grid[*q.add(1) as usize] as i32,
                        grid[*q.add(2) as usize] as i32,
                        grid[*q.add(3) as usize] as i32,
                        grid[*q.add(4) as usize] as i32,
                        grid[*q.add(5) as usize] as i32,
                        grid[*q.add(6) as usize] as i32,
                        grid[*q.add(7) as usize] as i32,
                    );
                    let neg = bits(iq3_signs(aux));
                    let ls = (2 * (aux >> 28) + 1) as i32;
                    let sv = scale_vec(ls, ls);
                    for c in 0..NC {
                        let x = ld(a.qs.as_ptr().add((c0 + c) * k + i * 256 + 32 * s).cast());
                        // Negate where the sign bit is set: (x ^ -1) - (-1) = -x.
                        let sx = _mm256_sub_epi8(_mm256_xor_si256(x, neg), neg);
                        isum[c] = dps(isum[c], g, sx, sv);
                    }
                }
                let d = h2f(p) * 0.25;
                for c in 0..NC {
                    let da = *a.d.get_unchecked((c0 + c) * nb + i);
                    acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[c]), _mm256_set1_ps(d * da), acc[c]);
                }
            }
            let mut out = [0f32; NC];
            for c in 0..NC {
                out[c] = hsum(acc[c]);
            }
            out
        }

        rows_driver!($feat, rows_q4_k, dot_q4_k);
        rows_driver!($feat, rows_q5_k, dot_q5_k);
        rows_driver!($feat, rows_q6_k, dot_q6_k);
        rows_driver!($feat, rows_iq3_xxs, dot_iq3_xxs);
    };
}
