//! VOPC compares (v_cmp_*, v_cmpx_*, v_cmp_class_*), in e32 (VCC) and e64 (SGPR) forms.
//! The condition and type are read from the opcode's mnemonic once.
use super::valu::Ops;
use super::{Ctx, Wave, unsupported};
use crate::decode::{Inst, src, valu_desc};
use crate::error::EmuError;
use crate::float::f16_to_f32;
use std::sync::OnceLock;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ty {
    F16,
    F32,
    F64,
    I16,
    I32,
    I64,
    U16,
    U32,
    U64,
}

#[derive(Clone, Copy)]
struct Cmp {
    cond: &'static str,
    ty: Ty,
    x: bool,
}

fn table() -> &'static [Option<Cmp>] {
    static T: OnceLock<Vec<Option<Cmp>>> = OnceLock::new();
    T.get_or_init(|| {
        (0..256u16)
            .map(|op| {
                let d = valu_desc(op)?;
                let name = if d.n32.is_empty() { d.n64 } else { d.n32 };
                let name = name.trim_end_matches("_e32").trim_end_matches("_e64");
                let (x, rest) = if let Some(r) = name.strip_prefix("v_cmpx_") {
                    (true, r)
                } else {
                    (false, name.strip_prefix("v_cmp_")?)
                };
                let (cond, ty) = rest.rsplit_once('_')?;
                let ty = match ty {
                    "f16" => Ty::F16,
                    "f32" => Ty::F32,
                    "f64" => Ty::F64,
                    "i16" => Ty::I16,
                    "i32" => Ty::I32,
                    "i64" => Ty::I64,
                    "u16" => Ty::U16,
                    "u32" => Ty::U32,
                    "u64" => Ty::U64,
                    _ => return None,
                };
                Some(Cmp { cond: Box::leak(cond.to_string().into_boxed_str()), ty, x })
            })
            .collect()
    })
}

// `a < b || a > b` is not `a != b` for NaN, and the negated forms are the point of the
// unordered compares: keep them literal.
#[allow(clippy::double_comparisons, clippy::neg_cmp_op_on_partial_ord)]
fn fcmp(cond: &str, a: f64, b: f64) -> Option<bool> {
    let un = a.is_nan() || b.is_nan();
    Some(match cond {
        "f" => false,
        "t" | "tru" => true,
        "lt" => a < b,
        "eq" => a == b,
        "le" => a <= b,
        "gt" => a > b,
        "lg" => a < b || a > b,
        "ge" => a >= b,
        "o" => !un,
        "u" => un,
        "nge" => !(a >= b),
        "nlg" => !(a < b || a > b),
        "ngt" => !(a > b),
        "nle" => !(a <= b),
        "neq" => !(a == b),
        "nlt" => !(a < b),
        _ => return None,
    })
}
fn icmp<T: PartialOrd>(cond: &str, a: T, b: T) -> Option<bool> {
    Some(match cond {
        "f" => false,
        "t" => true,
        "lt" => a < b,
        "eq" => a == b,
        "le" => a <= b,
        "gt" => a > b,
        "ne" | "lg" => a != b,
        "ge" => a >= b,
        _ => return None,
    })
}

/// IEEE class bit of a value: 0 sNaN, 1 qNaN, 2 -inf, 3 -normal, 4 -denormal, 5 -0, 6 +0,
/// 7 +denormal, 8 +normal, 9 +inf.
fn class(bits: u64, exp_bits: u32, man_bits: u32) -> u32 {
    let man = bits & ((1 << man_bits) - 1);
    let exp = (bits >> man_bits) & ((1 << exp_bits) - 1);
    let neg = bits >> (man_bits + exp_bits) & 1 != 0;
    let emax = (1 << exp_bits) - 1;
    if exp == emax && man != 0 {
        return if man >> (man_bits - 1) & 1 != 0 { 1 } else { 0 };
    }
    let k = if exp == emax {
        2
    } else if exp == 0 && man == 0 {
        5
    } else if exp == 0 {
        4
    } else {
        3
    };
    if neg { k } else { 11 - k }
}

/// v_cmp_class / v_cmpx_class opcodes (looked up once, not per instruction).
fn is_class_op(op: u16) -> bool {
    static T: OnceLock<Vec<bool>> = OnceLock::new();
    T.get_or_init(|| (0..256u16).map(|o| valu_desc(o).is_some_and(|d| d.n64.contains("class"))).collect())
        .get(op as usize)
        .copied()
        .unwrap_or(false)
}

pub fn exec(ctx: &Ctx, w: &mut Wave, i: &Inst, pc: u64) -> Result<(), EmuError> {
    let p = Ops::new(w, i);
    let is_class = is_class_op(i.op);
    let (x, bits) = if is_class {
        let name = valu_desc(i.op).map(|d| d.n64).unwrap_or("");
        let m = p.u(1);
        let mut bits = 0u32;
        let cmpx = name.starts_with("v_cmpx");
        if name.contains("f16") {
            let a = p.h(0);
            for l in 0..32 {
                if m[l] >> class(a[l] as u64, 5, 10) & 1 != 0 {
                    bits |= 1 << l;
                }
            }
        } else if name.contains("f64") {
            let a = p.u64(0);
            for l in 0..32 {
                if m[l] >> class(a[l], 11, 52) & 1 != 0 {
                    bits |= 1 << l;
                }
            }
        } else {
            let a = p.u(0);
            for l in 0..32 {
                if m[l] >> class(a[l] as u64, 8, 23) & 1 != 0 {
                    bits |= 1 << l;
                }
            }
        }
        (cmpx, bits)
    } else {
        let c = table()
            .get(i.op as usize)
            .copied()
            .flatten()
            .ok_or_else(|| unsupported(ctx, pc, i, "VOPC opcode not implemented"))?;
        let mut bits = 0u32;
        let mut bad = false;
        macro_rules! run {
            ($a:expr, $b:expr, $f:expr) => {{
                let (a, b) = ($a, $b);
                for l in 0..32 {
                    match $f(c.cond, a[l], b[l]) {
                        Some(true) => bits |= 1 << l,
                        Some(false) => {}
                        None => bad = true,
                    }
                }
            }};
        }
        match c.ty {
            Ty::F32 => run!(p.f(0).map(|v| v as f64), p.f(1).map(|v| v as f64), fcmp),
            Ty::F16 => run!(p.hf(0).map(|v| v as f64), p.hf(1).map(|v| v as f64), fcmp),
            Ty::F64 => run!(p.d(0), p.d(1), fcmp),
            Ty::I32 => run!(p.u(0).map(|v| v as i32), p.u(1).map(|v| v as i32), icmp),
            Ty::U32 => run!(p.u(0), p.u(1), icmp),
            Ty::I16 => run!(p.h(0).map(|v| v as i16), p.h(1).map(|v| v as i16), icmp),
            Ty::U16 => run!(p.h(0), p.h(1), icmp),
            Ty::I64 => run!(p.u64(0).map(|v| v as i64), p.u64(1).map(|v| v as i64), icmp),
            Ty::U64 => run!(p.u64(0), p.u64(1), icmp),
        }
        if bad {
            return Err(unsupported(ctx, pc, i, "compare condition"));
        }
        (c.x, bits)
    };
    let _ = f16_to_f32;
    let bits = bits & p.mask;
    if x {
        w.s[src::EXEC_LO as usize] = bits;
    } else {
        w.swrite(i.dst, bits);
        if i.dst < 124 && i.dst & 1 == 0 && i.dst != src::VCC_LO { /* wave32: only the low dword */ }
    }
    Ok(())
}
