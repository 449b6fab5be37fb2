//! VOP3P: packed 16-bit math, dot products (v_dot2/v_dot4/v_dot8), v_fma_mix, and WMMA.
use super::{Ctx, Wave, unsupported, wmma};
use crate::decode::{Inst, src};
use crate::error::EmuError;
use crate::float::*;
use crate::optable::vop3pop as o;

/// Raw 32-bit source of a packed op (16-bit inline constants as f16 in the low half).
fn raw(w: &Wave, i: &Inst, k: usize, f16: bool) -> [u32; 32] {
    let c = i.src[k];
    if c >= src::VGPR0 {
        w.v[(c - src::VGPR0) as usize]
    } else if f16 {
        [w.sval16(c, i.lit); 32]
    } else {
        [w.sval(c, i.lit); 32]
    }
}

/// (lo, hi) 16-bit halves of source k after op_sel/op_sel_hi and (for floats) neg_lo/neg_hi.
fn halves(w: &Wave, i: &Inst, k: usize, float: bool) -> ([u16; 32], [u16; 32]) {
    let r = raw(w, i, k, float);
    let (sl, sh) = (i.opsel >> k & 1 != 0, i.opsel_hi >> k & 1 != 0);
    let (nl, nh) = (float && i.neg >> k & 1 != 0, float && i.neg_hi >> k & 1 != 0);
    let mut lo = [0u16; 32];
    let mut hi = [0u16; 32];
    for l in 0..32 {
        lo[l] = if sl { (r[l] >> 16) as u16 } else { r[l] as u16 } ^ if nl { 0x8000 } else { 0 };
        hi[l] = if sh { (r[l] >> 16) as u16 } else { r[l] as u16 } ^ if nh { 0x8000 } else { 0 };
    }
    (lo, hi)
}

/// An f16 result in f16 denormal mode 0 loses its denormals (the sign stays).
fn flush16(w: &Wave, h: u32) -> u32 {
    if !w.f16_denorm && h & 0x7c00 == 0 { h & 0x8000 } else { h }
}

/// v_pk_fma_f16 on one half: rounded once; a NaN from numbers is 0xfe00.
fn fma16_bits(a: u16, b: u16, c: u16) -> u16 {
    let (x, y, z) = (f16_to_f32(a), f16_to_f32(b), f16_to_f32(c));
    let r = fma_once_f16(x as f64, y as f64, z as f64);
    if r & 0x7c00 == 0x7c00 && r & 0x3ff != 0 && !(x.is_nan() || y.is_nan() || z.is_nan()) { DEFAULT_NAN16 } else { r }
}

fn write(w: &mut Wave, i: &Inst, v: &[u32; 32]) {
    let e = w.exec();
    let d = &mut w.v[i.dst as usize];
    for l in 0..32 {
        if e >> l & 1 != 0 {
            d[l] = v[l];
        }
    }
}

pub fn exec(ctx: &Ctx, w: &mut Wave, i: &Inst, pc: u64) -> Result<(), EmuError> {
    let op = i.op;
    let mut out = [0u32; 32];
    macro_rules! pk_f {
        ($n:expr, $f:expr) => {{
            let a = halves(w, i, 0, true);
            let b = halves(w, i, 1, true);
            let c = if $n == 3 { halves(w, i, 2, true) } else { ([0; 32], [0; 32]) };
            for l in 0..32 {
                let h = |x: f32| {
                    let x = if i.clamp { if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) } } else { x };
                    f32_to_f16(x) as u32
                };
                let lo = $f(f16_to_f32(a.0[l]), f16_to_f32(b.0[l]), f16_to_f32(c.0[l]));
                let hi = $f(f16_to_f32(a.1[l]), f16_to_f32(b.1[l]), f16_to_f32(c.1[l]));
                out[l] = flush16(w, h(lo)) | flush16(w, h(hi)) << 16;
            }
        }};
    }
    // on raw f16 bits: min/max (signalling NaNs must survive) and the once-rounded fma
    macro_rules! pk_h {
        ($n:expr, $f:expr) => {{
            let a = halves(w, i, 0, true);
            let b = halves(w, i, 1, true);
            let c = if $n == 3 { halves(w, i, 2, true) } else { ([0; 32], [0; 32]) };
            let h = |x: u16| {
                if i.clamp {
                    let v = f16_to_f32(x);
                    if v.is_nan() { 0 } else { f32_to_f16(v.clamp(0.0, 1.0)) as u32 }
                } else {
                    x as u32
                }
            };
            for l in 0..32 {
                out[l] = flush16(w, h($f(a.0[l], b.0[l], c.0[l]))) | flush16(w, h($f(a.1[l], b.1[l], c.1[l]))) << 16;
            }
        }};
    }
    let ieee = w.ieee;
    macro_rules! pk_i {
        ($n:expr, $f:expr) => {{
            let a = halves(w, i, 0, false);
            let b = halves(w, i, 1, false);
            let c = if $n == 3 { halves(w, i, 2, false) } else { ([0; 32], [0; 32]) };
            for l in 0..32 {
                out[l] = $f(a.0[l], b.0[l], c.0[l]) as u32 | ($f(a.1[l], b.1[l], c.1[l]) as u32) << 16;
            }
        }};
    }
    match op {
        o::V_PK_ADD_F16 => pk_f!(2, |a: f32, b: f32, _c| a + b),
        o::V_PK_MUL_F16 => pk_f!(2, |a: f32, b: f32, _c| a * b),
        o::V_PK_MIN_F16 => pk_h!(2, |a: u16, b: u16, _c| min16_ieee(a, b, ieee)),
        o::V_PK_MAX_F16 => pk_h!(2, |a: u16, b: u16, _c| max16_ieee(a, b, ieee)),
        o::V_PK_FMA_F16 => pk_h!(3, |a: u16, b: u16, c: u16| fma16_bits(a, b, c)),
        o::V_PK_ADD_U16 => pk_i!(2, |a: u16, b: u16, _c| if i.clamp { a.saturating_add(b) } else { a.wrapping_add(b) }),
        o::V_PK_SUB_U16 => pk_i!(2, |a: u16, b: u16, _c| if i.clamp { a.saturating_sub(b) } else { a.wrapping_sub(b) }),
        o::V_PK_ADD_I16 => pk_i!(2, |a: u16, b: u16, _c| if i.clamp {
            (a as i16).saturating_add(b as i16) as u16
        } else {
            a.wrapping_add(b)
        }),
        o::V_PK_SUB_I16 => pk_i!(2, |a: u16, b: u16, _c| if i.clamp {
            (a as i16).saturating_sub(b as i16) as u16
        } else {
            a.wrapping_sub(b)
        }),
        o::V_PK_MUL_LO_U16 => pk_i!(2, |a: u16, b: u16, _c| a.wrapping_mul(b)),
        o::V_PK_MAD_U16 => pk_i!(3, |a: u16, b: u16, c: u16| a.wrapping_mul(b).wrapping_add(c)),
        o::V_PK_MAD_I16 => pk_i!(3, |a: u16, b: u16, c: u16| a.wrapping_mul(b).wrapping_add(c)),
        o::V_PK_LSHLREV_B16 => pk_i!(2, |a: u16, b: u16, _c| b << (a & 15)),
        o::V_PK_LSHRREV_B16 => pk_i!(2, |a: u16, b: u16, _c| b >> (a & 15)),
        o::V_PK_ASHRREV_I16 => pk_i!(2, |a: u16, b: u16, _c| ((b as i16) >> (a & 15)) as u16),
        o::V_PK_MAX_I16 => pk_i!(2, |a: u16, b: u16, _c| (a as i16).max(b as i16) as u16),
        o::V_PK_MIN_I16 => pk_i!(2, |a: u16, b: u16, _c| (a as i16).min(b as i16) as u16),
        o::V_PK_MAX_U16 => pk_i!(2, |a: u16, b: u16, _c| a.max(b)),
        o::V_PK_MIN_U16 => pk_i!(2, |a: u16, b: u16, _c| a.min(b)),
        o::V_DOT2_F32_F16 | o::V_DOT2_F32_BF16 => {
            let bf = op == o::V_DOT2_F32_BF16;
            let cv = |x: u16| if bf { bf16_to_f32(x) } else { f16_to_f32(x) };
            let a = halves(w, i, 0, true);
            let b = halves(w, i, 1, true);
            let c = raw(w, i, 2, false);
            for l in 0..32 {
                let cc = f32::from_bits(c[l] ^ if i.neg >> 2 & 1 != 0 { 0x8000_0000 } else { 0 });
                let mut r = cv(a.0[l]) * cv(b.0[l]) + cv(a.1[l]) * cv(b.1[l]) + cc;
                if i.clamp {
                    r = if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) };
                }
                out[l] = r.to_bits();
            }
        }
        o::V_DOT4_I32_IU8 | o::V_DOT4_U32_U8 | o::V_DOT8_I32_IU4 | o::V_DOT8_U32_U4 => {
            // For the iu variants NEG_LO[0]/[1] say whether A/B elements are signed.
            let iu = matches!(op, o::V_DOT4_I32_IU8 | o::V_DOT8_I32_IU4);
            let (sa, sb) = (iu && i.neg & 1 != 0, iu && i.neg & 2 != 0);
            let (bits, n) = if matches!(op, o::V_DOT4_I32_IU8 | o::V_DOT4_U32_U8) { (8, 4) } else { (4, 8) };
            let (a, b, c) = (raw(w, i, 0, false), raw(w, i, 1, false), raw(w, i, 2, false));
            let ext = |x: u32, k: u32, s: bool| -> i64 {
                let v = (x >> (bits * k)) & ((1 << bits) - 1);
                if s && v >> (bits - 1) != 0 { v as i64 - (1 << bits) } else { v as i64 }
            };
            for l in 0..32 {
                let mut acc: i64 = if iu { c[l] as i32 as i64 } else { c[l] as i64 };
                for k in 0..n {
                    acc += ext(a[l], k, sa) * ext(b[l], k, sb);
                }
                out[l] = if i.clamp {
                    if iu {
                        acc.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32
                    } else {
                        acc.clamp(0, u32::MAX as i64) as u32
                    }
                } else {
                    acc as u32
                };
            }
        }
        o::V_FMA_MIX_F32 | o::V_FMA_MIXLO_F16 | o::V_FMA_MIXHI_F16 => {
            // op_sel_hi[k] = 1: source k is f16 (half chosen by op_sel[k]); 0: f32.
            // neg_hi acts as abs for mix ops.
            let mut s = [[0f32; 32]; 3];
            for k in 0..3 {
                let r = raw(w, i, k, i.opsel_hi >> k & 1 != 0);
                for l in 0..32 {
                    let mut x = if i.opsel_hi >> k & 1 != 0 {
                        f16_to_f32(if i.opsel >> k & 1 != 0 { (r[l] >> 16) as u16 } else { r[l] as u16 })
                    } else {
                        f32::from_bits(r[l])
                    };
                    if i.neg_hi >> k & 1 != 0 {
                        x = x.abs();
                    }
                    if i.neg >> k & 1 != 0 {
                        x = -x;
                    }
                    s[k][l] = x;
                }
            }
            let old = w.v[i.dst as usize];
            for l in 0..32 {
                // one rounding, to the destination's precision (the f16 forms do not round to
                // f32 first)
                let (x, y, z) = (s[0][l] as f64, s[1][l] as f64, s[2][l] as f64);
                let generated = |nan: bool| nan && !(s[0][l].is_nan() || s[1][l].is_nan() || s[2][l].is_nan());
                out[l] = if op == o::V_FMA_MIX_F32 {
                    let mut r = fma_once_f32(x, y, z);
                    if generated(r.is_nan()) {
                        r = f32::from_bits(DEFAULT_NAN32);
                    }
                    if i.clamp {
                        r = if r.is_nan() { 0.0 } else { r.clamp(0.0, 1.0) };
                    }
                    r.to_bits()
                } else {
                    let mut h = fma_once_f16(x, y, z);
                    if generated(h & 0x7c00 == 0x7c00 && h & 0x3ff != 0) {
                        h = DEFAULT_NAN16;
                    }
                    if i.clamp {
                        let v = f16_to_f32(h);
                        h = if v.is_nan() { 0 } else { f32_to_f16(v.clamp(0.0, 1.0)) };
                    }
                    let h = flush16(w, h as u32);
                    if op == o::V_FMA_MIXLO_F16 { (old[l] & 0xffff_0000) | h } else { (old[l] & 0xffff) | h << 16 }
                };
            }
        }
        o::V_WMMA_F32_16X16X16_F16
        | o::V_WMMA_F32_16X16X16_BF16
        | o::V_WMMA_F16_16X16X16_F16
        | o::V_WMMA_BF16_16X16X16_BF16
        | o::V_WMMA_I32_16X16X16_IU8
        | o::V_WMMA_I32_16X16X16_IU4 => {
            return wmma::exec(ctx, w, i, pc);
        }
        _ => return Err(unsupported(ctx, pc, i, "VOP3P opcode not implemented")),
    }
    write(w, i, &out);
    Ok(())
}
