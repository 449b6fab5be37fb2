//! VALU (VOP1/VOP2/VOP3/VOP3SD and their DPP forms) and VOPD.
use super::{Ctx, Wave, dpp, unsupported, vcmp};
use crate::decode::{Dpp, Inst, src};
use crate::error::EmuError;
use crate::float::*;
use crate::optable::vop as o;

type R = [u32; 32];

/// Operand access for one instruction: DPP-swizzled src0 and the lane write mask.
pub struct Ops<'a> {
    pub w: &'a mut Wave,
    pub i: &'a Inst,
    pub s0: Option<R>,
    pub mask: u32,
}

impl<'a> Ops<'a> {
    pub fn new(w: &'a mut Wave, i: &'a Inst) -> Ops<'a> {
        let mut mask = w.exec();
        let mut s0 = None;
        if i.dpp_kind != Dpp::None {
            let row = w.vsrc(i.src[0], i.lit);
            let (r, m) = dpp::fetch(w, i, &row);
            mask &= m;
            s0 = Some(r);
        }
        Ops { w, i, s0, mask }
    }
    /// Raw 32 bits of source k (16-bit constants as f16 when `h` is set).
    #[inline]
    pub fn raw(&self, k: usize, h: bool) -> R {
        if k == 0
            && let Some(r) = self.s0
        {
            return r;
        }
        let c = self.i.src[k];
        if c >= src::VGPR0 {
            self.w.v[(c - src::VGPR0) as usize]
        } else if h {
            [self.w.sval16(c, self.i.lit); 32]
        } else {
            [self.w.sval(c, self.i.lit); 32]
        }
    }
    #[inline]
    pub fn u(&self, k: usize) -> R {
        self.raw(k, false)
    }
    /// f32 source with abs/neg modifiers and input denormal flushing.
    #[inline]
    pub fn f(&self, k: usize) -> [f32; 32] {
        let r = self.raw(k, false);
        let (ab, ng) = (self.i.abs >> k & 1 != 0, self.i.neg >> k & 1 != 0);
        let mut out = [0f32; 32];
        for l in 0..32 {
            let mut b = r[l];
            if ab {
                b &= 0x7fff_ffff;
            }
            if ng {
                b ^= 0x8000_0000;
            }
            out[l] = f32::from_bits(b);
        }
        if !self.w.f32_denorm {
            for x in out.iter_mut() {
                *x = ftz(*x);
            }
        }
        out
    }
    /// 16-bit source half (op_sel picks the high half), raw bits.
    #[inline]
    pub fn h(&self, k: usize) -> [u16; 32] {
        let r = self.raw(k, true);
        let hi = self.i.opsel >> k & 1 != 0;
        let mut out = [0u16; 32];
        for l in 0..32 {
            out[l] = if hi { (r[l] >> 16) as u16 } else { r[l] as u16 };
        }
        out
    }
    /// f16 source as f32, with modifiers (f16 denormals flushed in f16 denormal mode 0).
    #[inline]
    pub fn hf(&self, k: usize) -> [f32; 32] {
        let r = self.hm(k);
        let mut out = [0f32; 32];
        for l in 0..32 {
            out[l] = f16_to_f32(r[l]);
        }
        out
    }
    /// f16 source bits with abs/neg and the denormal mode applied (for the ops that must see
    /// a signalling NaN as such: a conversion to f32 quiets it).
    #[inline]
    pub fn hm(&self, k: usize) -> [u16; 32] {
        let mut r = self.h(k);
        let (ab, ng) = (self.i.abs >> k & 1 != 0, self.i.neg >> k & 1 != 0);
        let flush = !self.w.f16_denorm;
        for b in r.iter_mut() {
            if ab {
                *b &= 0x7fff;
            }
            if ng {
                *b ^= 0x8000;
            }
            if flush && *b & 0x7c00 == 0 {
                *b &= 0x8000;
            }
        }
        r
    }
    pub fn d(&self, k: usize) -> [f64; 32] {
        let r = self.w.vsrc64(self.i.src[k], self.i.lit, true);
        let (ab, ng) = (self.i.abs >> k & 1 != 0, self.i.neg >> k & 1 != 0);
        let mut out = [0f64; 32];
        for l in 0..32 {
            let mut b = r[l];
            if ab {
                b &= !(1 << 63);
            }
            if ng {
                b ^= 1 << 63;
            }
            out[l] = f64::from_bits(b);
        }
        out
    }
    pub fn u64(&self, k: usize) -> [u64; 32] {
        self.w.vsrc64(self.i.src[k], self.i.lit, false)
    }
    /// Scalar value of source k (lane-uniform operands such as lane selects).
    pub fn sc(&self, k: usize) -> u32 {
        self.w.sval(self.i.src[k], self.i.lit)
    }

    #[inline]
    pub fn wu(&mut self, v: &R) {
        let d = &mut self.w.v[self.i.dst as usize];
        for l in 0..32 {
            if self.mask >> l & 1 != 0 {
                d[l] = v[l];
            }
        }
    }
    /// f32 result: omod, clamp, denormal flush.
    #[inline]
    pub fn wf(&mut self, v: &[f32; 32]) {
        let mut r = [0u32; 32];
        let scale = [1.0f32, 2.0, 4.0, 0.5][self.i.omod as usize];
        for l in 0..32 {
            let mut x = v[l];
            if self.i.omod != 0 {
                x *= scale;
            }
            if self.i.clamp {
                x = if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
            }
            if !self.w.f32_denorm {
                x = ftz(x);
            }
            r[l] = x.to_bits();
        }
        self.wu(&r);
    }
    /// 16-bit result into the half selected by op_sel[3]; the other half is kept.
    #[inline]
    pub fn wh(&mut self, v: &[u16; 32]) {
        let hi = self.i.opsel & 8 != 0;
        let d = &mut self.w.v[self.i.dst as usize];
        for l in 0..32 {
            if self.mask >> l & 1 != 0 {
                d[l] = if hi { (d[l] & 0xffff) | (v[l] as u32) << 16 } else { (d[l] & 0xffff_0000) | v[l] as u32 };
            }
        }
    }
    pub fn whf(&mut self, v: &[f32; 32]) {
        let mut r = [0u16; 32];
        for l in 0..32 {
            let mut x = v[l];
            if self.i.clamp {
                x = if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
            }
            r[l] = f32_to_f16(x);
        }
        self.whm(&r);
    }
    /// f16 result bits: clamp, f16 denormal flush (mode 0), into the op_sel[3] half.
    pub fn whm(&mut self, v: &[u16; 32]) {
        let mut r = *v;
        let flush = !self.w.f16_denorm;
        for b in r.iter_mut() {
            if self.i.clamp {
                let x = f16_to_f32(*b);
                *b = if x.is_nan() { 0 } else { f32_to_f16(x.clamp(0.0, 1.0)) };
            }
            if flush && *b & 0x7c00 == 0 {
                *b &= 0x8000;
            }
        }
        self.wh(&r);
    }
    pub fn wu64(&mut self, v: &[u64; 32]) {
        let mask = self.mask;
        let dst = self.i.dst as usize;
        for l in 0..32 {
            if mask >> l & 1 != 0 {
                self.w.v[dst][l] = v[l] as u32;
                self.w.v[(dst + 1) % 256][l] = (v[l] >> 32) as u32;
            }
        }
    }
    pub fn wd(&mut self, v: &[f64; 32]) {
        let mut r = [0u64; 32];
        for l in 0..32 {
            let mut x = v[l];
            if self.i.clamp {
                x = if x.is_nan() { 0.0 } else { x.clamp(0.0, 1.0) };
            }
            r[l] = x.to_bits();
        }
        self.wu64(&r);
    }
    /// Scalar lane mask result (carry-out / compare): inactive lanes read 0.
    pub fn wmask(&mut self, code: u16, bits: u32) {
        self.w.swrite(code, bits & self.w.exec());
    }
}

macro_rules! lanes {
    ($n:ident, $body:expr) => {{
        let mut out = [Default::default(); 32];
        for $n in 0..32 {
            out[$n] = $body;
        }
        out
    }};
}

pub fn exec(ctx: &Ctx, w: &mut Wave, i: &Inst, pc: u64) -> Result<(), EmuError> {
    if i.op < 0x100 {
        return vcmp::exec(ctx, w, i, pc);
    }
    let mut p = Ops::new(w, i);
    if !alu(&mut p)? && !special(&mut p)? {
        return Err(unsupported(ctx, pc, i, "VALU opcode not implemented"));
    }
    Ok(())
}

/// Lane-wise arithmetic. Returns false for opcodes it does not know.
fn alu(p: &mut Ops) -> Result<bool, EmuError> {
    let op = p.i.op;
    macro_rules! u1 {
        ($f:expr) => {{
            let a = p.u(0);
            let r: R = lanes!(l, $f(a[l]));
            p.wu(&r);
        }};
    }
    macro_rules! u2 {
        ($f:expr) => {{
            let (a, b) = (p.u(0), p.u(1));
            let r: R = lanes!(l, $f(a[l], b[l]));
            p.wu(&r);
        }};
    }
    macro_rules! u3 {
        ($f:expr) => {{
            let (a, b, c) = (p.u(0), p.u(1), p.u(2));
            let r: R = lanes!(l, $f(a[l], b[l], c[l]));
            p.wu(&r);
        }};
    }
    macro_rules! f1 {
        ($f:expr) => {{
            let a = p.f(0);
            let r: [f32; 32] = lanes!(l, $f(a[l]));
            p.wf(&r);
        }};
    }
    macro_rules! f2 {
        ($f:expr) => {{
            let (a, b) = (p.f(0), p.f(1));
            let r: [f32; 32] = lanes!(l, $f(a[l], b[l]));
            p.wf(&r);
        }};
    }
    macro_rules! f3 {
        ($f:expr) => {{
            let (a, b, c) = (p.f(0), p.f(1), p.f(2));
            let r: [f32; 32] = lanes!(l, $f(a[l], b[l], c[l]));
            p.wf(&r);
        }};
    }
    macro_rules! h2 {
        ($f:expr) => {{
            let (a, b) = (p.hf(0), p.hf(1));
            let r: [f32; 32] = lanes!(l, $f(a[l], b[l]));
            p.whf(&r);
        }};
    }
    macro_rules! h1 {
        ($f:expr) => {{
            let a = p.hf(0);
            let r: [f32; 32] = lanes!(l, $f(a[l]));
            p.whf(&r);
        }};
    }
    // f16 transcendentals: a NaN from a number is the default NaN (0xfe00)
    macro_rules! h1n {
        ($f:expr) => {{
            let a = p.hf(0);
            let r: [f32; 32] = lanes!(l, nan_result32(a[l], $f(a[l])));
            p.whf(&r);
        }};
    }
    // f32 transcendentals: "denormals are flushed" (inputs and results, in every denormal
    // mode); a NaN from a number is the default NaN (0xffc00000)
    macro_rules! tr1 {
        ($f:expr) => {{
            let a = p.f(0);
            let r: [f32; 32] = lanes!(l, {
                let x = ftz(a[l]);
                ftz(nan_result32(x, $f(x)))
            });
            p.wf(&r);
        }};
    }
    // f16 min/max family on raw bits
    macro_rules! m16 {
        ($f:expr) => {{
            let (a, b, c) = (p.hm(0), p.hm(1), p.hm(2));
            let ieee = p.w.ieee;
            let r: [u16; 32] = lanes!(l, $f(a[l], b[l], c[l], ieee));
            p.whm(&r);
        }};
    }
    macro_rules! i2 {
        ($f:expr) => {{
            let (a, b) = (p.h(0), p.h(1));
            let r: [u16; 32] = lanes!(l, $f(a[l], b[l]));
            p.wh(&r);
        }};
    }
    macro_rules! d2 {
        ($f:expr) => {{
            let (a, b) = (p.d(0), p.d(1));
            let r: [f64; 32] = lanes!(l, $f(a[l], b[l]));
            p.wd(&r);
        }};
    }
    macro_rules! d1 {
        ($f:expr) => {{
            let a = p.d(0);
            let r: [f64; 32] = lanes!(l, $f(a[l]));
            p.wd(&r);
        }};
    }
    let sx24 = |x: u32| ((x << 8) as i32) >> 8;
    match op {
        o::V_MOV_B32 => {
            let a = if p.i.abs | p.i.neg != 0 { p.f(0).map(f32::to_bits) } else { p.u(0) };
            p.wu(&a)
        }
        o::V_MOV_B16 => {
            let a = p.h(0);
            p.wh(&a)
        }
        o::V_NOT_B32 => u1!(|a: u32| !a),
        o::V_BFREV_B32 => u1!(|a: u32| a.reverse_bits()),
        o::V_CLZ_I32_U32 => u1!(|a: u32| if a == 0 { u32::MAX } else { a.leading_zeros() }),
        o::V_CTZ_I32_B32 => u1!(|a: u32| if a == 0 { u32::MAX } else { a.trailing_zeros() }),
        o::V_CLS_I32 => u1!(|a: u32| {
            let x = if (a as i32) < 0 { !a } else { a };
            if x == 0 { u32::MAX } else { x.leading_zeros() - 1 }
        }),
        o::V_ADD_NC_U32 => u2!(|a: u32, b: u32| if p.i.clamp { a.saturating_add(b) } else { a.wrapping_add(b) }),
        o::V_SUB_NC_U32 => u2!(|a: u32, b: u32| if p.i.clamp { a.saturating_sub(b) } else { a.wrapping_sub(b) }),
        o::V_SUBREV_NC_U32 => u2!(|a: u32, b: u32| if p.i.clamp { b.saturating_sub(a) } else { b.wrapping_sub(a) }),
        o::V_ADD_NC_I32 => {
            u2!(|a: u32, b: u32| if p.i.clamp { (a as i32).saturating_add(b as i32) as u32 } else { a.wrapping_add(b) })
        }
        o::V_SUB_NC_I32 => {
            u2!(|a: u32, b: u32| if p.i.clamp { (a as i32).saturating_sub(b as i32) as u32 } else { a.wrapping_sub(b) })
        }
        o::V_MUL_LO_U32 => u2!(|a: u32, b: u32| a.wrapping_mul(b)),
        o::V_MUL_HI_U32 => u2!(|a: u32, b: u32| ((a as u64 * b as u64) >> 32) as u32),
        o::V_MUL_HI_I32 => u2!(|a: u32, b: u32| ((a as i32 as i64 * b as i32 as i64) >> 32) as u32),
        o::V_MUL_U32_U24 => u2!(|a: u32, b: u32| (a & 0xff_ffff).wrapping_mul(b & 0xff_ffff)),
        o::V_MUL_HI_U32_U24 => u2!(|a: u32, b: u32| (((a & 0xff_ffff) as u64 * (b & 0xff_ffff) as u64) >> 32) as u32),
        o::V_MUL_I32_I24 => u2!(|a: u32, b: u32| sx24(a).wrapping_mul(sx24(b)) as u32),
        o::V_MUL_HI_I32_I24 => u2!(|a: u32, b: u32| ((sx24(a) as i64 * sx24(b) as i64) >> 32) as u32),
        o::V_MAD_U32_U24 => u3!(|a: u32, b: u32, c: u32| (a & 0xff_ffff).wrapping_mul(b & 0xff_ffff).wrapping_add(c)),
        o::V_MAD_I32_I24 => u3!(|a: u32, b: u32, c: u32| sx24(a).wrapping_mul(sx24(b)).wrapping_add(c as i32) as u32),
        o::V_AND_B32 => u2!(|a: u32, b: u32| a & b),
        o::V_OR_B32 => u2!(|a: u32, b: u32| a | b),
        o::V_XOR_B32 => u2!(|a: u32, b: u32| a ^ b),
        o::V_XNOR_B32 => u2!(|a: u32, b: u32| !(a ^ b)),
        o::V_LSHLREV_B32 => u2!(|a: u32, b: u32| b << (a & 31)),
        o::V_LSHRREV_B32 => u2!(|a: u32, b: u32| b >> (a & 31)),
        o::V_ASHRREV_I32 => u2!(|a: u32, b: u32| ((b as i32) >> (a & 31)) as u32),
        o::V_MIN_I32 => u2!(|a: u32, b: u32| (a as i32).min(b as i32) as u32),
        o::V_MAX_I32 => u2!(|a: u32, b: u32| (a as i32).max(b as i32) as u32),
        o::V_MIN_U32 => u2!(|a: u32, b: u32| a.min(b)),
        o::V_MAX_U32 => u2!(|a: u32, b: u32| a.max(b)),
        o::V_BFM_B32 => u2!(|a: u32, b: u32| (((1u64 << (a & 31)) - 1) as u32) << (b & 31)),
        o::V_BCNT_U32_B32 => u2!(|a: u32, b: u32| a.count_ones().wrapping_add(b)),
        o::V_BFE_U32 => u3!(|a: u32, b: u32, c: u32| {
            let (off, wd) = (b & 31, c & 31);
            if wd == 0 { 0 } else { (a >> off) & ((1u32 << wd) - 1) }
        }),
        o::V_BFE_I32 => u3!(|a: u32, b: u32, c: u32| {
            let (off, wd) = (b & 31, c & 31);
            if wd == 0 { 0 } else { (((a >> off) << (32 - wd)) as i32 >> (32 - wd)) as u32 }
        }),
        o::V_BFI_B32 => u3!(|a: u32, b: u32, c: u32| (a & b) | (!a & c)),
        o::V_ALIGNBIT_B32 => u3!(|a: u32, b: u32, c: u32| (((a as u64) << 32 | b as u64) >> (c & 31)) as u32),
        o::V_ALIGNBYTE_B32 => u3!(|a: u32, b: u32, c: u32| (((a as u64) << 32 | b as u64) >> (8 * (c & 3))) as u32),
        o::V_PERM_B32 => u3!(|a: u32, b: u32, c: u32| perm(a, b, c)),
        o::V_LSHL_ADD_U32 => u3!(|a: u32, b: u32, c: u32| (a << (b & 31)).wrapping_add(c)),
        o::V_ADD_LSHL_U32 => u3!(|a: u32, b: u32, c: u32| a.wrapping_add(b) << (c & 31)),
        o::V_LSHL_OR_B32 => u3!(|a: u32, b: u32, c: u32| (a << (b & 31)) | c),
        o::V_AND_OR_B32 => u3!(|a: u32, b: u32, c: u32| (a & b) | c),
        o::V_OR3_B32 => u3!(|a: u32, b: u32, c: u32| a | b | c),
        o::V_XOR3_B32 => u3!(|a: u32, b: u32, c: u32| a ^ b ^ c),
        o::V_ADD3_U32 => u3!(|a: u32, b: u32, c: u32| a.wrapping_add(b).wrapping_add(c)),
        o::V_XAD_U32 => u3!(|a: u32, b: u32, c: u32| (a ^ b).wrapping_add(c)),
        o::V_MIN3_I32 => u3!(|a: u32, b: u32, c: u32| (a as i32).min(b as i32).min(c as i32) as u32),
        o::V_MAX3_I32 => u3!(|a: u32, b: u32, c: u32| (a as i32).max(b as i32).max(c as i32) as u32),
        o::V_MED3_I32 => u3!(|a: u32, b: u32, c: u32| {
            let (a, b, c) = (a as i32, b as i32, c as i32);
            a.min(b).max(a.max(b).min(c)) as u32
        }),
        o::V_MIN3_U32 => u3!(|a: u32, b: u32, c: u32| a.min(b).min(c)),
        o::V_MAX3_U32 => u3!(|a: u32, b: u32, c: u32| a.max(b).max(c)),
        o::V_MED3_U32 => u3!(|a: u32, b: u32, c: u32| a.min(b).max(a.max(b).min(c))),
        o::V_MAXMIN_U32 => u3!(|a: u32, b: u32, c: u32| a.max(b).min(c)),
        o::V_MINMAX_U32 => u3!(|a: u32, b: u32, c: u32| a.min(b).max(c)),
        o::V_MAXMIN_I32 => u3!(|a: u32, b: u32, c: u32| (a as i32).max(b as i32).min(c as i32) as u32),
        o::V_MINMAX_I32 => u3!(|a: u32, b: u32, c: u32| (a as i32).min(b as i32).max(c as i32) as u32),
        o::V_SAD_U32 => u3!(|a: u32, b: u32, c: u32| a.abs_diff(b).wrapping_add(c)),
        o::V_SAD_U8 => u3!(|a: u32, b: u32, c: u32| (0..4)
            .map(|k| ((a >> 8 * k) as u8).abs_diff((b >> 8 * k) as u8) as u32)
            .sum::<u32>()
            .wrapping_add(c)),
        o::V_CVT_F32_UBYTE0 | o::V_CVT_F32_UBYTE1 | o::V_CVT_F32_UBYTE2 | o::V_CVT_F32_UBYTE3 => {
            let k = op - o::V_CVT_F32_UBYTE0;
            let a = p.u(0);
            let r: [f32; 32] = lanes!(l, ((a[l] >> (8 * k)) & 0xff) as f32);
            p.wf(&r)
        }
        o::V_CVT_F32_I32 => {
            let a = p.u(0);
            let r: [f32; 32] = lanes!(l, a[l] as i32 as f32);
            p.wf(&r)
        }
        o::V_CVT_F32_U32 => {
            let a = p.u(0);
            let r: [f32; 32] = lanes!(l, a[l] as f32);
            p.wf(&r)
        }
        o::V_CVT_I32_F32 => {
            let a = p.f(0);
            let r: R = lanes!(l, f2i(a[l]) as u32);
            p.wu(&r)
        }
        o::V_CVT_U32_F32 => {
            let a = p.f(0);
            let r: R = lanes!(l, f2u(a[l]));
            p.wu(&r)
        }
        o::V_CVT_NEAREST_I32_F32 => {
            let a = p.f(0);
            let r: R = lanes!(l, f2i((a[l] + 0.5).floor()) as u32);
            p.wu(&r)
        }
        o::V_CVT_FLOOR_I32_F32 => {
            let a = p.f(0);
            let r: R = lanes!(l, f2i(a[l].floor()) as u32);
            p.wu(&r)
        }
        o::V_CVT_F16_F32 => {
            let a = p.f(0);
            p.whf(&a)
        }
        o::V_CVT_F32_F16 => {
            let a = p.hf(0);
            p.wf(&a)
        }
        o::V_CVT_F16_U16 => {
            let a = p.h(0);
            let r: [f32; 32] = lanes!(l, a[l] as f32);
            p.whf(&r)
        }
        o::V_CVT_F16_I16 => {
            let a = p.h(0);
            let r: [f32; 32] = lanes!(l, a[l] as i16 as f32);
            p.whf(&r)
        }
        o::V_CVT_U16_F16 => {
            let a = p.hf(0);
            let r: [u16; 32] = lanes!(l, if a[l].is_nan() { 0 } else { a[l] as u16 });
            p.wh(&r)
        }
        o::V_CVT_I16_F16 => {
            let a = p.hf(0);
            let r: [u16; 32] = lanes!(l, if a[l].is_nan() { 0 } else { a[l] as i16 as u16 });
            p.wh(&r)
        }
        o::V_CVT_I32_I16 => {
            let a = p.h(0);
            let r: R = lanes!(l, a[l] as i16 as i32 as u32);
            p.wu(&r)
        }
        o::V_CVT_U32_U16 => {
            let a = p.h(0);
            let r: R = lanes!(l, a[l] as u32);
            p.wu(&r)
        }
        o::V_CVT_PK_RTZ_F16_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let r: R = lanes!(l, f32_to_f16_rtz(a[l]) as u32 | (f32_to_f16_rtz(b[l]) as u32) << 16);
            p.wu(&r)
        }
        o::V_PACK_B32_F16 => {
            let (a, b) = (p.hf(0), p.hf(1));
            let r: R = lanes!(l, f32_to_f16(a[l]) as u32 | (f32_to_f16(b[l]) as u32) << 16);
            p.wu(&r)
        }
        o::V_CVT_PK_U16_U32 => u2!(|a: u32, b: u32| a.min(0xffff) | b.min(0xffff) << 16),
        o::V_CVT_PK_I16_I32 => u2!(|a: u32, b: u32| ((a as i32).clamp(-32768, 32767) as u16 as u32)
            | ((b as i32).clamp(-32768, 32767) as u16 as u32) << 16),
        o::V_CVT_F64_F32 => {
            let a = p.f(0);
            let r: [f64; 32] = lanes!(l, a[l] as f64);
            p.wd(&r)
        }
        o::V_CVT_F32_F64 => {
            let a = p.d(0);
            let r: [f32; 32] = lanes!(l, a[l] as f32);
            p.wf(&r)
        }
        o::V_CVT_F64_I32 => {
            let a = p.u(0);
            let r: [f64; 32] = lanes!(l, a[l] as i32 as f64);
            p.wd(&r)
        }
        o::V_CVT_F64_U32 => {
            let a = p.u(0);
            let r: [f64; 32] = lanes!(l, a[l] as f64);
            p.wd(&r)
        }
        o::V_CVT_I32_F64 => {
            let a = p.d(0);
            let r: R = lanes!(l, d2i(a[l]) as u32);
            p.wu(&r)
        }
        o::V_CVT_U32_F64 => {
            let a = p.d(0);
            let r: R = lanes!(l, d2u(a[l]));
            p.wu(&r)
        }
        o::V_ADD_F32 => f2!(|a: f32, b: f32| a + b),
        o::V_SUB_F32 => f2!(|a: f32, b: f32| a - b),
        o::V_SUBREV_F32 => f2!(|a: f32, b: f32| b - a),
        o::V_MUL_F32 => f2!(|a: f32, b: f32| a * b),
        o::V_MUL_DX9_ZERO_F32 => f2!(|a: f32, b: f32| if a == 0.0 || b == 0.0 { 0.0 } else { a * b }),
        o::V_MIN_F32 => {
            let ieee = p.w.ieee;
            f2!(|a, b| min_ieee(a, b, ieee))
        }
        o::V_MAX_F32 => {
            let ieee = p.w.ieee;
            f2!(|a, b| max_ieee(a, b, ieee))
        }
        o::V_LDEXP_F32 => {
            let (a, b) = (p.f(0), p.u(1));
            let r: [f32; 32] = lanes!(l, ldexp(a[l], b[l] as i32));
            p.wf(&r)
        }
        o::V_FMA_F32 => {
            let (a, b, c) = (p.f(0), p.f(1), p.f(2));
            let r = fma_lanes(&a, &b, &c);
            p.wf(&r)
        }
        o::V_FMA_DX9_ZERO_F32 => f3!(|a: f32, b: f32, c: f32| if a == 0.0 || b == 0.0 { c } else { a.mul_add(b, c) }),
        o::V_MIN3_F32 => {
            let e = p.w.ieee;
            f3!(|a, b, c| min_ieee(min_ieee(a, b, e), c, e))
        }
        o::V_MAX3_F32 => {
            let e = p.w.ieee;
            f3!(|a, b, c| max_ieee(max_ieee(a, b, e), c, e))
        }
        o::V_MED3_F32 => {
            let e = p.w.ieee;
            f3!(|a, b, c| med3_ieee(a, b, c, e))
        }
        o::V_MAXMIN_F32 => {
            let e = p.w.ieee;
            f3!(|a, b, c| min_ieee(max_ieee(a, b, e), c, e))
        }
        o::V_MINMAX_F32 => {
            let e = p.w.ieee;
            f3!(|a, b, c| max_ieee(min_ieee(a, b, e), c, e))
        }
        o::V_FMAC_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let c = p.w.v[p.i.dst as usize].map(f32::from_bits);
            let r = fma_lanes(&a, &b, &c);
            p.wf(&r)
        }
        o::V_FMAC_DX9_ZERO_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let c = p.w.v[p.i.dst as usize];
            let r: [f32; 32] = lanes!(
                l,
                if a[l] == 0.0 || b[l] == 0.0 {
                    f32::from_bits(c[l])
                } else {
                    a[l].mul_add(b[l], f32::from_bits(c[l]))
                }
            );
            p.wf(&r)
        }
        o::V_FMAMK_F32 => {
            let (a, c) = (p.f(0), p.f(1));
            let k = [f32::from_bits(p.i.lit); 32];
            let r = fma_lanes(&a, &k, &c);
            p.wf(&r)
        }
        o::V_FMAAK_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let k = [f32::from_bits(p.i.lit); 32];
            let r = fma_lanes(&a, &b, &k);
            p.wf(&r)
        }
        o::V_FRACT_F32 => f1!(fract),
        o::V_TRUNC_F32 => f1!(f32::trunc),
        o::V_CEIL_F32 => f1!(f32::ceil),
        o::V_FLOOR_F32 => f1!(f32::floor),
        o::V_RNDNE_F32 => f1!(rndne),
        o::V_EXP_F32 => tr1!(f32::exp2),
        o::V_LOG_F32 => tr1!(f32::log2),
        o::V_RCP_F32 | o::V_RCP_IFLAG_F32 => tr1!(|a: f32| 1.0 / a),
        o::V_RSQ_F32 => tr1!(|a: f32| 1.0 / a.sqrt()),
        o::V_SQRT_F32 => tr1!(f32::sqrt),
        // sin(S0 * 2 pi) in f64 with exact turn reduction; denormals supported
        o::V_SIN_F32 => f1!(|a: f32| nan_result32(a, sin_turns(a as f64, false) as f32)),
        o::V_COS_F32 => f1!(|a: f32| nan_result32(a, sin_turns(a as f64, true) as f32)),
        o::V_FREXP_MANT_F32 => f1!(|a: f32| frexp(a).0),
        o::V_FREXP_EXP_I32_F32 => {
            let a = p.f(0);
            let r: R = lanes!(l, frexp(a[l]).1 as u32);
            p.wu(&r)
        }
        o::V_ADD_F16 => h2!(|a: f32, b: f32| a + b),
        o::V_SUB_F16 => h2!(|a: f32, b: f32| a - b),
        o::V_SUBREV_F16 => h2!(|a: f32, b: f32| b - a),
        o::V_MUL_F16 => h2!(|a: f32, b: f32| a * b),
        o::V_MIN_F16 => m16!(|a, b, _c, e| min16_ieee(a, b, e)),
        o::V_MAX_F16 => m16!(|a, b, _c, e| max16_ieee(a, b, e)),
        o::V_LDEXP_F16 => {
            let (a, b) = (p.hf(0), p.h(1));
            let r: [f32; 32] = lanes!(l, ldexp(a[l], b[l] as i16 as i32));
            p.whf(&r)
        }
        // f16 FMAs round once (through f32 they would round twice)
        o::V_FMA_F16 => {
            let (a, b, c) = (p.hf(0), p.hf(1), p.hf(2));
            let r: [u16; 32] = lanes!(l, fma16(a[l], b[l], c[l]));
            p.whm(&r)
        }
        o::V_FMAC_F16 => {
            let (a, b) = (p.hf(0), p.hf(1));
            let hi = p.i.opsel & 8 != 0;
            let c = p.w.v[p.i.dst as usize];
            let r: [u16; 32] =
                lanes!(l, fma16(a[l], b[l], f16_to_f32(if hi { (c[l] >> 16) as u16 } else { c[l] as u16 })));
            p.whm(&r)
        }
        o::V_FMAMK_F16 => {
            let (a, c) = (p.hf(0), p.hf(1));
            let k = f16_to_f32(p.i.lit as u16);
            let r: [u16; 32] = lanes!(l, fma16(a[l], k, c[l]));
            p.whm(&r)
        }
        o::V_FMAAK_F16 => {
            let (a, b) = (p.hf(0), p.hf(1));
            let k = f16_to_f32(p.i.lit as u16);
            let r: [u16; 32] = lanes!(l, fma16(a[l], b[l], k));
            p.whm(&r)
        }
        o::V_SQRT_F16 => h1n!(f32::sqrt),
        o::V_RCP_F16 => h1n!(|a: f32| 1.0 / a),
        o::V_RSQ_F16 => h1n!(|a: f32| 1.0 / a.sqrt()),
        o::V_EXP_F16 => h1n!(f32::exp2),
        o::V_LOG_F16 => h1n!(f32::log2),
        o::V_FLOOR_F16 => h1!(f32::floor),
        o::V_CEIL_F16 => h1!(f32::ceil),
        o::V_TRUNC_F16 => h1!(f32::trunc),
        o::V_RNDNE_F16 => h1!(rndne),
        o::V_FRACT_F16 => h1!(fract),
        o::V_ADD_NC_U16 => i2!(|a: u16, b: u16| a.wrapping_add(b)),
        o::V_SUB_NC_U16 => i2!(|a: u16, b: u16| a.wrapping_sub(b)),
        o::V_MUL_LO_U16 => i2!(|a: u16, b: u16| a.wrapping_mul(b)),
        o::V_ADD_NC_I16 => i2!(|a: u16, b: u16| a.wrapping_add(b)),
        o::V_SUB_NC_I16 => i2!(|a: u16, b: u16| a.wrapping_sub(b)),
        o::V_MAX_U16 => i2!(|a: u16, b: u16| a.max(b)),
        o::V_MIN_U16 => i2!(|a: u16, b: u16| a.min(b)),
        o::V_MAX_I16 => i2!(|a: u16, b: u16| (a as i16).max(b as i16) as u16),
        o::V_MIN_I16 => i2!(|a: u16, b: u16| (a as i16).min(b as i16) as u16),
        o::V_LSHLREV_B16 => i2!(|a: u16, b: u16| b << (a & 15)),
        o::V_LSHRREV_B16 => i2!(|a: u16, b: u16| b >> (a & 15)),
        o::V_ASHRREV_I16 => i2!(|a: u16, b: u16| ((b as i16) >> (a & 15)) as u16),
        o::V_AND_B16 => i2!(|a: u16, b: u16| a & b),
        o::V_OR_B16 => i2!(|a: u16, b: u16| a | b),
        o::V_XOR_B16 => i2!(|a: u16, b: u16| a ^ b),
        o::V_NOT_B16 => {
            let a = p.h(0);
            let r: [u16; 32] = lanes!(l, !a[l]);
            p.wh(&r)
        }
        o::V_ADD_F64 => d2!(|a: f64, b: f64| a + b),
        o::V_MUL_F64 => d2!(|a: f64, b: f64| a * b),
        o::V_MIN_F64 => {
            let e = p.w.ieee;
            d2!(|a, b| min64_ieee(a, b, e))
        }
        o::V_MAX_F64 => {
            let e = p.w.ieee;
            d2!(|a, b| max64_ieee(a, b, e))
        }
        o::V_FMA_F64 => {
            let (a, b, c) = (p.d(0), p.d(1), p.d(2));
            let r: [f64; 32] = lanes!(l, a[l].mul_add(b[l], c[l]));
            p.wd(&r)
        }
        o::V_LDEXP_F64 => {
            let (a, b) = (p.d(0), p.u(1));
            let r: [f64; 32] = lanes!(l, ldexp64(a[l], b[l] as i32));
            p.wd(&r)
        }
        o::V_RCP_F64 => d1!(|a: f64| 1.0 / a),
        o::V_RSQ_F64 => d1!(|a: f64| 1.0 / a.sqrt()),
        o::V_SQRT_F64 => d1!(f64::sqrt),
        o::V_TRUNC_F64 => d1!(f64::trunc),
        o::V_CEIL_F64 => d1!(f64::ceil),
        o::V_FLOOR_F64 => d1!(f64::floor),
        o::V_RNDNE_F64 => d1!(f64::round_ties_even),
        o::V_FRACT_F64 => d1!(|a: f64| if a.is_finite() {
            (a - a.floor()).min(f64::from_bits(0x3fef_ffff_ffff_ffff))
        } else if a.is_nan() {
            quiet64(a)
        } else {
            f64::from_bits(DEFAULT_NAN64)
        }),
        o::V_FREXP_MANT_F64 => d1!(|a: f64| frexp64(a).0),
        o::V_FREXP_EXP_I32_F64 => {
            let a = p.d(0);
            let r: R = lanes!(l, frexp64(a[l]).1 as u32);
            p.wu(&r)
        }
        o::V_LSHLREV_B64 => {
            let (a, b) = (p.u(0), p.u64(1));
            let r: [u64; 32] = lanes!(l, b[l] << (a[l] & 63));
            p.wu64(&r)
        }
        o::V_LSHRREV_B64 => {
            let (a, b) = (p.u(0), p.u64(1));
            let r: [u64; 32] = lanes!(l, b[l] >> (a[l] & 63));
            p.wu64(&r)
        }
        o::V_ASHRREV_I64 => {
            let (a, b) = (p.u(0), p.u64(1));
            let r: [u64; 32] = lanes!(l, ((b[l] as i64) >> (a[l] & 63)) as u64);
            p.wu64(&r)
        }
        o::V_MAD_U16 => {
            let (a, b, c) = (p.h(0), p.h(1), p.h(2));
            let r: [u16; 32] = lanes!(l, a[l].wrapping_mul(b[l]).wrapping_add(c[l]));
            p.wh(&r)
        }
        o::V_MAD_I16 => {
            let (a, b, c) = (p.h(0), p.h(1), p.h(2));
            let r: [u16; 32] = lanes!(l, (a[l] as i16).wrapping_mul(b[l] as i16).wrapping_add(c[l] as i16) as u16);
            p.wh(&r)
        }
        o::V_MAD_U32_U16 => {
            let (a, b, c) = (p.h(0), p.h(1), p.u(2));
            let r: R = lanes!(l, (a[l] as u32 * b[l] as u32).wrapping_add(c[l]));
            p.wu(&r)
        }
        o::V_MAD_I32_I16 => {
            let (a, b, c) = (p.h(0), p.h(1), p.u(2));
            let r: R = lanes!(l, (a[l] as i16 as i32 * b[l] as i16 as i32).wrapping_add(c[l] as i32) as u32);
            p.wu(&r)
        }
        o::V_MIN3_F16 => m16!(|a, b, c, e| min16_ieee(min16_ieee(a, b, e), c, e)),
        o::V_MAX3_F16 => m16!(|a, b, c, e| max16_ieee(max16_ieee(a, b, e), c, e)),
        o::V_MED3_F16 => m16!(med3_16_ieee),
        o::V_MAXMIN_F16 => m16!(|a, b, c, e| min16_ieee(max16_ieee(a, b, e), c, e)),
        o::V_MINMAX_F16 => m16!(|a, b, c, e| max16_ieee(min16_ieee(a, b, e), c, e)),
        o::V_MIN3_I16 | o::V_MAX3_I16 | o::V_MED3_I16 => {
            let (a, b, c) = (p.h(0), p.h(1), p.h(2));
            let r: [u16; 32] = lanes!(l, {
                let (a, b, c) = (a[l] as i16, b[l] as i16, c[l] as i16);
                (match op {
                    o::V_MIN3_I16 => a.min(b).min(c),
                    o::V_MAX3_I16 => a.max(b).max(c),
                    _ => a.min(b).max(a.max(b).min(c)),
                }) as u16
            });
            p.wh(&r)
        }
        o::V_MIN3_U16 | o::V_MAX3_U16 | o::V_MED3_U16 => {
            let (a, b, c) = (p.h(0), p.h(1), p.h(2));
            let r: [u16; 32] = lanes!(l, {
                let (a, b, c) = (a[l], b[l], c[l]);
                match op {
                    o::V_MIN3_U16 => a.min(b).min(c),
                    o::V_MAX3_U16 => a.max(b).max(c),
                    _ => a.min(b).max(a.max(b).min(c)),
                }
            });
            p.wh(&r)
        }
        o::V_CVT_PK_U8_F32 => {
            // byte S1 of S2 = u8(S0)
            let (a, b, c) = (p.f(0), p.u(1), p.u(2));
            let r: R = lanes!(l, {
                let k = 8 * (b[l] & 3);
                let v = if a[l].is_nan() { 0 } else { a[l].round_ties_even().clamp(0.0, 255.0) as u32 };
                (c[l] & !(0xff << k)) | v << k
            });
            p.wu(&r)
        }
        o::V_SAD_HI_U8 => u3!(|a: u32, b: u32, c: u32| ((0..4)
            .map(|k| ((a >> 8 * k) as u8).abs_diff((b >> 8 * k) as u8) as u32)
            .sum::<u32>()
            << 16)
            .wrapping_add(c)),
        o::V_SAD_U16 => u3!(|a: u32, b: u32, c: u32| ((a as u16).abs_diff(b as u16) as u32
            + ((a >> 16) as u16).abs_diff((b >> 16) as u16) as u32)
            .wrapping_add(c)),
        o::V_MSAD_U8 => u3!(|a: u32, b: u32, c: u32| (0..4)
            .filter(|k| (b >> 8 * k) as u8 != 0)
            .map(|k| ((a >> 8 * k) as u8).abs_diff((b >> 8 * k) as u8) as u32)
            .sum::<u32>()
            .wrapping_add(c)),
        o::V_LERP_U8 => u3!(|a: u32, b: u32, c: u32| (0..4)
            .map(|k| {
                let (x, y, r) = ((a >> 8 * k) & 0xff, (b >> 8 * k) & 0xff, (c >> 8 * k) & 1);
                ((x + y + r) >> 1) << 8 * k
            })
            .sum::<u32>()),
        o::V_SAT_PK_U8_I16 => {
            let a = p.u(0);
            let r: [u16; 32] =
                lanes!(l, ((a[l] as i16).clamp(0, 255) as u16) | (((a[l] >> 16) as i16).clamp(0, 255) as u16) << 8);
            p.wh(&r)
        }
        o::V_CVT_PK_I16_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let c = |x: f32| if x.is_nan() { 0 } else { x.clamp(-32768.0, 32767.0) as i16 as u16 as u32 };
            let r: R = lanes!(l, c(a[l]) | c(b[l]) << 16);
            p.wu(&r)
        }
        o::V_CVT_PK_U16_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let c = |x: f32| if x.is_nan() { 0 } else { x.clamp(0.0, 65535.0) as u16 as u32 };
            let r: R = lanes!(l, c(a[l]) | c(b[l]) << 16);
            p.wu(&r)
        }
        o::V_CVT_PK_NORM_I16_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let c = |x: f32| {
                if x.is_nan() { 0 } else { (x.clamp(-1.0, 1.0) * 32767.0).round_ties_even() as i16 as u16 as u32 }
            };
            let r: R = lanes!(l, c(a[l]) | c(b[l]) << 16);
            p.wu(&r)
        }
        o::V_CVT_PK_NORM_U16_F32 => {
            let (a, b) = (p.f(0), p.f(1));
            let c = |x: f32| if x.is_nan() { 0 } else { (x.clamp(0.0, 1.0) * 65535.0).round_ties_even() as u16 as u32 };
            let r: R = lanes!(l, c(a[l]) | c(b[l]) << 16);
            p.wu(&r)
        }
        o::V_CVT_OFF_F32_I4 => {
            let a = p.u(0);
            let r: [f32; 32] = lanes!(l, (((a[l] & 0xf) << 28) as i32 >> 28) as f32 * 0.0625);
            p.wf(&r)
        }
        o::V_FREXP_MANT_F16 => h1!(|a: f32| frexp(a).0),
        o::V_FREXP_EXP_I16_F16 => {
            let a = p.hf(0);
            let r: [u16; 32] = lanes!(l, frexp(a[l]).1 as i16 as u16);
            p.wh(&r)
        }
        o::V_SIN_F16 => h1n!(|a: f32| sin_turns(a as f64, false) as f32),
        o::V_COS_F16 => h1n!(|a: f32| sin_turns(a as f64, true) as f32),
        o::V_MOVRELS_B32 | o::V_MOVRELD_B32 | o::V_MOVRELSD_B32 | o::V_MOVRELSD_2_B32 => {
            // M0-relative VGPR indexing
            let m0 = p.w.s[125] as usize;
            let s = (p.i.src[0].wrapping_sub(crate::decode::src::VGPR0)) as usize;
            let d = p.i.dst as usize;
            let (sr, dr) = match op {
                o::V_MOVRELS_B32 => (s + m0, d),
                o::V_MOVRELD_B32 => (s, d + m0),
                o::V_MOVRELSD_B32 => (s + m0, d + m0),
                _ => (s + (m0 & 0xffff), d + (m0 >> 16)),
            };
            if p.i.src[0] < crate::decode::src::VGPR0 && op != o::V_MOVRELD_B32 {
                return Ok(false);
            }
            let v = if p.i.src[0] < crate::decode::src::VGPR0 { p.u(0) } else { p.w.v[sr % 256] };
            let m = p.mask;
            for l in 0..32 {
                if m >> l & 1 != 0 {
                    p.w.v[dr % 256][l] = v[l];
                }
            }
        }
        o::V_CVT_NORM_I16_F16 => {
            let a = p.hf(0);
            let r: [u16; 32] = lanes!(
                l,
                if a[l].is_nan() { 0 } else { (a[l].clamp(-1.0, 1.0) * 32767.0).round_ties_even() as i16 as u16 }
            );
            p.wh(&r)
        }
        o::V_CVT_NORM_U16_F16 => {
            let a = p.hf(0);
            let r: [u16; 32] =
                lanes!(l, if a[l].is_nan() { 0 } else { (a[l].clamp(0.0, 1.0) * 65535.0).round_ties_even() as u16 });
            p.wh(&r)
        }
        o::V_CVT_PK_NORM_I16_F16 => {
            let (a, b) = (p.hf(0), p.hf(1));
            let c = |x: f32| {
                if x.is_nan() { 0 } else { (x.clamp(-1.0, 1.0) * 32767.0).round_ties_even() as i16 as u16 as u32 }
            };
            let r: R = lanes!(l, c(a[l]) | c(b[l]) << 16);
            p.wu(&r)
        }
        o::V_CVT_PK_NORM_U16_F16 => {
            let (a, b) = (p.hf(0), p.hf(1));
            let c = |x: f32| if x.is_nan() { 0 } else { (x.clamp(0.0, 1.0) * 65535.0).round_ties_even() as u16 as u32 };
            let r: R = lanes!(l, c(a[l]) | c(b[l]) << 16);
            p.wu(&r)
        }
        o::V_DIV_FIXUP_F64 => {
            let (a, b, c) = (p.d(0), p.d(1), p.d(2));
            let r: [f64; 32] = lanes!(l, div_fixup64(a[l], b[l], c[l]));
            p.wd(&r)
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// v_perm_b32 byte select: 0-3 bytes of b, 4-7 bytes of a, 8-11 sign fill, 12 zero, 13+ 0xff.
pub fn perm(a: u32, b: u32, sel: u32) -> u32 {
    let v = (a as u64) << 32 | b as u64;
    let mut r = 0u32;
    for k in 0..4 {
        let s = (sel >> (8 * k)) & 0xff;
        let byte = match s {
            0..=7 => (v >> (8 * s)) as u8 as u32,
            8..=11 => {
                let src = (v >> (16 * (s - 8) + 8)) as u8;
                if src & 0x80 != 0 { 0xff } else { 0 }
            }
            12 => 0,
            _ => 0xff,
        };
        r |= byte << (8 * k);
    }
    r
}

/// Instructions with scalar results, carries, lane selects or implicit operands.
fn special(p: &mut Ops) -> Result<bool, EmuError> {
    let op = p.i.op;
    match op {
        o::V_NOP | o::V_PIPEFLUSH => {}
        o::V_READFIRSTLANE_B32 => {
            let a = p.u(0);
            let e = p.w.exec();
            let lane = if e == 0 { 0 } else { e.trailing_zeros() as usize };
            p.w.swrite(p.i.dst, a[lane]);
        }
        o::V_READLANE_B32 => {
            let a = p.u(0);
            let lane = p.sc(1) as usize & 31;
            p.w.swrite(p.i.dst, a[lane]);
        }
        o::V_WRITELANE_B32 => {
            let v = p.sc(0);
            let lane = p.sc(1) as usize & 31;
            p.w.v[p.i.dst as usize][lane] = v;
        }
        o::V_CNDMASK_B32 => {
            let (a, b) = if p.i.abs | p.i.neg != 0 {
                (p.f(0).map(f32::to_bits), p.f(1).map(f32::to_bits))
            } else {
                (p.u(0), p.u(1))
            };
            let m = p.w.sval(p.i.src[2], p.i.lit);
            let r: R = lanes!(l, if m >> l & 1 != 0 { b[l] } else { a[l] });
            p.wu(&r)
        }
        o::V_CNDMASK_B16 => {
            let (a, b) = (p.h(0), p.h(1));
            let m = p.w.sval(p.i.src[2], p.i.lit);
            let r: [u16; 32] = lanes!(l, if m >> l & 1 != 0 { b[l] } else { a[l] });
            p.wh(&r)
        }
        o::V_ADD_CO_U32
        | o::V_SUB_CO_U32
        | o::V_SUBREV_CO_U32
        | o::V_ADD_CO_CI_U32
        | o::V_SUB_CO_CI_U32
        | o::V_SUBREV_CO_CI_U32 => {
            let (mut a, mut b) = (p.u(0), p.u(1));
            let ci = if matches!(op, o::V_ADD_CO_CI_U32 | o::V_SUB_CO_CI_U32 | o::V_SUBREV_CO_CI_U32) {
                p.w.sval(p.i.src[2], p.i.lit)
            } else {
                0
            };
            if matches!(op, o::V_SUBREV_CO_U32 | o::V_SUBREV_CO_CI_U32) {
                std::mem::swap(&mut a, &mut b);
            }
            let sub = !matches!(op, o::V_ADD_CO_U32 | o::V_ADD_CO_CI_U32);
            let mut r = [0u32; 32];
            let mut carry = 0u32;
            for l in 0..32 {
                let c = (ci >> l & 1) as u64;
                let (v, co) = if sub {
                    let v = (a[l] as u64).wrapping_sub(b[l] as u64).wrapping_sub(c);
                    (v as u32, (b[l] as u64 + c) > a[l] as u64)
                } else {
                    let v = a[l] as u64 + b[l] as u64 + c;
                    (v as u32, v >> 32 != 0)
                };
                r[l] = v;
                if co {
                    carry |= 1 << l;
                }
            }
            p.wu(&r);
            let sd = p.i.sdst;
            p.wmask(sd, carry);
        }
        o::V_MAD_U64_U32 | o::V_MAD_I64_I32 => {
            let (a, b, c) = (p.u(0), p.u(1), p.u64(2));
            let mut r = [0u64; 32];
            let mut carry = 0;
            for l in 0..32 {
                if op == o::V_MAD_U64_U32 {
                    let v = a[l] as u128 * b[l] as u128 + c[l] as u128;
                    r[l] = v as u64;
                    if v >> 64 != 0 {
                        carry |= 1 << l;
                    }
                } else {
                    let v = a[l] as i32 as i128 * b[l] as i32 as i128 + c[l] as i64 as i128;
                    r[l] = v as u64;
                    if v != v as i64 as i128 {
                        carry |= 1 << l;
                    }
                }
            }
            p.wu64(&r);
            let sd = p.i.sdst;
            p.wmask(sd, carry);
        }
        o::V_MBCNT_LO_U32_B32 | o::V_MBCNT_HI_U32_B32 => {
            let (a, b) = (p.u(0), p.u(1));
            let r: R = lanes!(l, {
                let below = if op == o::V_MBCNT_LO_U32_B32 {
                    if l == 0 { 0 } else { a[l] & (u32::MAX >> (32 - l)) }
                } else {
                    0
                };
                below.count_ones().wrapping_add(b[l])
            });
            p.wu(&r)
        }
        o::V_PERMLANE16_B32 | o::V_PERMLANEX16_B32 => {
            let a = p.u(0);
            let old = p.w.v[p.i.dst as usize];
            let (s1, s2) = (p.sc(1), p.sc(2));
            let r = dpp::permlane(p.w, p.i, &a, &old, s1, s2, op == o::V_PERMLANEX16_B32);
            p.wu(&r)
        }
        o::V_DIV_SCALE_F32 => {
            // Pre-scale numerator/denominator (S2/S1) so the reciprocal iteration stays in
            // range; VCC tells v_div_fmas to undo a one-sided scale (ISA pseudo-code).
            let (a, b, c) = (p.f(0), p.f(1), p.f(2));
            let ex = |x: f32| ((x.to_bits() >> 23) & 0xff) as i32;
            let mut r = [0f32; 32];
            let mut vcc = 0u32;
            for l in 0..32 {
                let (s0, den, num) = (a[l], b[l], c[l]);
                let mut d = s0;
                let q = num as f64 / den as f64;
                let tiny = |x: f64| x != 0.0 && x.abs() < f32::MIN_POSITIVE as f64;
                if num == 0.0 || den == 0.0 {
                    d = f32::NAN;
                } else if ex(num) - ex(den) >= 96 {
                    vcc |= 1 << l;
                    if s0 == den {
                        d = ldexp(s0, 64);
                    }
                } else if den.is_subnormal() {
                    d = ldexp(s0, 64);
                } else if tiny(1.0 / den as f64) && tiny(q) {
                    // 1/d and n/d both denormal: the pseudo-code's ldexp(S0, 64) would take a
                    // denominator near 2^127 to inf; scaling it down (and the quotient up,
                    // VCC for v_div_fmas) is what keeps v_rcp_f32 (which flushes denormals)
                    // in range and the division correctly rounded
                    vcc |= 1 << l;
                    if s0 == den {
                        d = ldexp(s0, -64);
                    }
                } else if tiny(1.0 / den as f64) {
                    d = ldexp(s0, -64);
                } else if tiny(q) {
                    vcc |= 1 << l;
                    if s0 == num {
                        d = ldexp(s0, 64);
                    }
                } else if ex(num) <= 23 {
                    d = ldexp(s0, 64);
                }
                r[l] = d;
            }
            // the scaled values must not be flushed even in flush mode
            let bits: R = lanes!(l, r[l].to_bits());
            p.wu(&bits);
            let sd = p.i.sdst;
            p.wmask(sd, vcc);
        }
        o::V_DIV_FMAS_F32 => {
            // "Input denormals are not flushed, but output flushing is allowed." The scale is
            // fused: applied to the exact fma, then one rounding (a denormal quotient rounds
            // once). The pseudo-code's fixed 2^32 cannot be literal (v_div_scale scales by
            // 2^64 in either direction): the direction undoes the one-sided scale, up for huge
            // quotients (S2 >= 1), down for tiny ones, as LLVM's division sequence needs.
            let raw = |k: usize| -> [f32; 32] {
                let r = p.raw(k, false);
                let (ab, ng) = (p.i.abs >> k & 1 != 0, p.i.neg >> k & 1 != 0);
                lanes!(
                    l,
                    f32::from_bits((if ab { r[l] & 0x7fff_ffff } else { r[l] }) ^ if ng { 0x8000_0000 } else { 0 })
                )
            };
            let (a, b, c) = (raw(0), raw(1), raw(2));
            let vcc = p.w.vcc();
            let r: [f32; 32] = lanes!(l, {
                let (x, y, z) = (a[l] as f64, b[l] as f64, c[l] as f64);
                if vcc >> l & 1 == 0 || !(x * y).is_finite() || !z.is_finite() {
                    fma_once_f32(x, y, z)
                } else {
                    let (s, e) = two_sum(x * y, z);
                    let k = 2f64.powi(if ((c[l].to_bits() >> 23) & 0xff) >= 127 { 64 } else { -64 });
                    round_pair_f32(s * k, e * k)
                }
            });
            p.wf(&r)
        }
        o::V_DIV_SCALE_F64 => {
            // same decision tree as the f32 form, with f64 limits (exponent gap 768, tiny
            // numerator exponent <= 53), scaling by 2^128
            let (a, b, c) = (p.d(0), p.d(1), p.d(2));
            let ex = |x: f64| ((x.to_bits() >> 52) & 0x7ff) as i32;
            let mut r = [0f64; 32];
            let mut vcc = 0u32;
            for l in 0..32 {
                let (s0, den, num) = (a[l], b[l], c[l]);
                let mut d = s0;
                let tiny = |x: f64| x != 0.0 && x.abs() < f64::MIN_POSITIVE;
                if num == 0.0 || den == 0.0 {
                    d = f64::NAN;
                } else if ex(num) - ex(den) >= 768 {
                    vcc |= 1 << l;
                    if s0 == den {
                        d = ldexp64(s0, 128);
                    }
                } else if den.is_subnormal() {
                    d = ldexp64(s0, 128);
                } else if tiny(1.0 / den) && tiny(num / den) {
                    vcc |= 1 << l;
                    if s0 == den {
                        d = ldexp64(s0, -128);
                    }
                } else if tiny(1.0 / den) {
                    d = ldexp64(s0, -128);
                } else if tiny(num / den) {
                    vcc |= 1 << l;
                    if s0 == num {
                        d = ldexp64(s0, 128);
                    }
                } else if ex(num) <= 53 {
                    d = ldexp64(s0, 128);
                }
                r[l] = d;
            }
            let bits: [u64; 32] = lanes!(l, r[l].to_bits());
            p.wu64(&bits);
            let sd = p.i.sdst;
            p.wmask(sd, vcc);
        }
        o::V_DIV_FMAS_F64 => {
            let (a, b, c) = (p.d(0), p.d(1), p.d(2));
            let vcc = p.w.vcc();
            let r: [f64; 32] = lanes!(l, {
                let v = a[l].mul_add(b[l], c[l]);
                if vcc >> l & 1 != 0 {
                    ldexp64(v, if ((c[l].to_bits() >> 52) & 0x7ff) >= 1023 { 128 } else { -128 })
                } else {
                    v
                }
            });
            p.wd(&r)
        }
        o::V_DIV_FIXUP_F32 => {
            // a = quotient estimate, b = denominator, c = numerator (ISA pseudo-code)
            let (a, b, c) = (p.f(0), p.f(1), p.f(2));
            let r: [f32; 32] = lanes!(l, div_fixup32(a[l], b[l], c[l]));
            p.wf(&r)
        }
        o::V_DIV_FIXUP_F16 => {
            let (a, b, c) = (p.hf(0), p.hf(1), p.hf(2));
            let r: [f32; 32] = lanes!(l, div_fixup16(a[l], b[l], c[l]));
            p.whf(&r)
        }
        o::V_SWAP_B32 => {
            let (d, s) = (p.i.dst as usize, (p.i.src[0] - src::VGPR0) as usize);
            let e = p.mask;
            for l in 0..32 {
                if e >> l & 1 != 0 {
                    let t = p.w.v[d][l];
                    p.w.v[d][l] = p.w.v[s][l];
                    p.w.v[s][l] = t;
                }
            }
        }
        o::V_DOT2ACC_F32_F16 => {
            let (a, b) = (p.u(0), p.u(1));
            let c = p.w.v[p.i.dst as usize];
            let r: [f32; 32] = lanes!(l, dot2_f16(a[l], b[l], f32::from_bits(c[l])));
            p.wf(&r)
        }
        o::V_DOT2_F16_F16 | o::V_DOT2_BF16_BF16 => {
            let (a, b) = (p.u(0), p.u(1));
            let c = p.h(2);
            let bf = op == o::V_DOT2_BF16_BF16;
            let cv = |x: u16| if bf { bf16_to_f32(x) } else { f16_to_f32(x) };
            let r: [u16; 32] = lanes!(l, {
                let s =
                    cv(a[l] as u16) * cv(b[l] as u16) + cv((a[l] >> 16) as u16) * cv((b[l] >> 16) as u16) + cv(c[l]);
                if bf { f32_to_bf16(s) } else { f32_to_f16(s) }
            });
            p.wh(&r)
        }
        _ => return Ok(false),
    }
    Ok(true)
}

pub fn dot2_f16(a: u32, b: u32, c: f32) -> f32 {
    let p0 = f16_to_f32(a as u16) * f16_to_f32(b as u16);
    let p1 = f16_to_f32((a >> 16) as u16) * f16_to_f32((b >> 16) as u16);
    p0 + p1 + c
}

/// f16 fma of f16 values (as f32), rounded once to f16 bits; a NaN from numbers is 0xfe00.
fn fma16(a: f32, b: f32, c: f32) -> u16 {
    let r = fma_once_f16(a as f64, b as f64, c as f64);
    if r & 0x7c00 == 0x7c00 && r & 0x3ff != 0 && !(a.is_nan() || b.is_nan() || c.is_nan()) { DEFAULT_NAN16 } else { r }
}

/// VOPD: two independent VALU ops; all sources are read before either result is written.
pub fn vopd(ctx: &Ctx, w: &mut Wave, i: &Inst, pc: u64) -> Result<(), EmuError> {
    let mut x = Inst {
        fam: crate::decode::Fam::Valu,
        op: i.op,
        dst: i.dst,
        src: [i.src[0], i.src[1], src::VCC_LO],
        shape: [1, 1, 1, 0],
        ..*i
    };
    let mut y = Inst {
        fam: crate::decode::Fam::Valu,
        op: i.op_y,
        dst: i.dst_y,
        src: [i.src_y[0], i.src_y[1], src::VCC_LO],
        shape: [1, 1, 1, 0],
        ..*i
    };
    for h in [&mut x, &mut y] {
        h.enc = crate::decode::Enc::Vop2;
        if h.op == o::V_FMAMK_F32 {
            h.src = [h.src[0], h.src[1], 0];
        }
    }
    // Y first, result parked; then X sees the original Y destination.
    let saved = w.v[y.dst as usize];
    exec(ctx, w, &y, pc)?;
    let ry = w.v[y.dst as usize];
    w.v[y.dst as usize] = saved;
    exec(ctx, w, &x, pc)?;
    w.v[y.dst as usize] = ry;
    Ok(())
}
