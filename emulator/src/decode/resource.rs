//! MUBUF, MTBUF, MIMG, EXP, VINTERP and LDSDIR decoding (field layout: RDNA3 ISA, checked
//! against llvm-mc-22). The software device executes none of these (it refuses them by name
//! when a wave reaches one); they are decoded so that the disassembler lists every gfx11
//! encoding and the executor's refusal can name the instruction.
//!
//! Fields of [`Inst`] for these families:
//! * MUBUF/MTBUF: `dst` vdata, `src[0]` vaddr (VGPR index), `src[1]` srsrc (SGPR code),
//!   `saddr` soffset (operand code), `imm` offset, `op_y` MTBUF format, `flags` as below.
//! * MIMG: `dst` vdata, `src` [vaddr0, srsrc, ssamp], `lit` the NSA dword (vaddr1..4, one byte
//!   each), `imm` dim, `op_y` dmask, `flags` as below.
//! * EXP: `op` target, `imm` enable mask, `lit` the four vsrc bytes, `flags` DONE / ROW_EN.
//! * VINTERP: like VOP3 (`dst`, `src`, `neg`, `opsel`, `clamp`), `imm` wait_exp.
//! * LDSDIR: `dst` vdst, `imm` wait_vdst, `src[0]` attribute, `src[1]` channel.
use super::resource_ops::{MIMG, MUBUF, UFMT};
use super::{DecodeError, Enc, Fam, Inst};

/// `Inst::flags` bits beyond glc (0), slc (1), dlc (2).
pub mod flag {
    pub const OFFEN: u16 = 1 << 4;
    pub const IDXEN: u16 = 1 << 5;
    pub const TFE: u16 = 1 << 6;
    pub const LWE: u16 = 1 << 7;
    pub const UNORM: u16 = 1 << 8;
    pub const R128: u16 = 1 << 9;
    pub const A16: u16 = 1 << 10;
    pub const D16: u16 = 1 << 11;
    pub const NSA: u16 = 1 << 12;
    /// EXP
    pub const DONE: u16 = 1 << 4;
    pub const ROW_EN: u16 = 1 << 5;
}

fn lookup(t: &'static [(u8, &'static str)], op: u16) -> Option<&'static str> {
    t.iter().find(|(o, _)| *o as u16 == op).map(|(_, n)| *n)
}
pub fn mubuf_name(op: u16) -> Option<&'static str> {
    lookup(MUBUF, op)
}
pub fn mimg_name(op: u16) -> Option<&'static str> {
    lookup(MIMG, op)
}
/// MTBUF opcodes are the first 16 MUBUF ones with a `t` in front.
pub fn mtbuf_name(op: u16) -> Option<&'static str> {
    const N: [&str; 16] = [
        "tbuffer_load_format_x",
        "tbuffer_load_format_xy",
        "tbuffer_load_format_xyz",
        "tbuffer_load_format_xyzw",
        "tbuffer_store_format_x",
        "tbuffer_store_format_xy",
        "tbuffer_store_format_xyz",
        "tbuffer_store_format_xyzw",
        "tbuffer_load_d16_format_x",
        "tbuffer_load_d16_format_xy",
        "tbuffer_load_d16_format_xyz",
        "tbuffer_load_d16_format_xyzw",
        "tbuffer_store_d16_format_x",
        "tbuffer_store_d16_format_xy",
        "tbuffer_store_d16_format_xyz",
        "tbuffer_store_d16_format_xyzw",
    ];
    N.get(op as usize).copied()
}
pub fn vinterp_name(op: u16) -> Option<&'static str> {
    const N: [&str; 6] = [
        "v_interp_p10_f32",
        "v_interp_p2_f32",
        "v_interp_p10_f16_f32",
        "v_interp_p2_f16_f32",
        "v_interp_p10_rtz_f16_f32",
        "v_interp_p2_rtz_f16_f32",
    ];
    N.get(op as usize).copied()
}
/// Symbolic name of an MTBUF unified format (64+ have none).
pub fn ufmt_name(f: u16) -> Option<&'static str> {
    UFMT.get(f as usize).copied()
}
pub fn ldsdir_name(op: u16) -> Option<&'static str> {
    ["lds_param_load", "lds_direct_load"].get(op as usize).copied()
}

fn cache_bits(w0: u32) -> u16 {
    // glc 14, slc 12, dlc 13 (the same bits in MUBUF, MTBUF and MIMG)
    (((w0 >> 14) & 1) | (((w0 >> 12) & 1) << 1) | (((w0 >> 13) & 1) << 2)) as u16
}

/// Whether an SGPR tuple of `n` registers from operand code `c` is one LLVM accepts (inside
/// s0..s105 or ttmp0..15; `null` stands for any width).
fn sgpr_tuple_ok(c: u16, n: u16) -> bool {
    match c {
        0..=105 => c + n - 1 <= 105,
        108..=123 => c - 108 + n <= 16,
        124 => true,
        _ => false,
    }
}

fn buffer_common(mut i: Inst, w0: u32, w1: u32) -> Inst {
    i.len = 8;
    i.imm = (w0 & 0xfff) as i32;
    i.dst = ((w1 >> 8) & 0xff) as u16;
    i.src = [(w1 & 0xff) as u16, ((w1 >> 16) & 0x1f) as u16 * 4, 0];
    i.saddr = (w1 >> 24) as u16;
    i.flags = cache_bits(w0)
        | if w1 >> 21 & 1 != 0 { flag::TFE } else { 0 }
        | if w1 >> 22 & 1 != 0 { flag::OFFEN } else { 0 }
        | if w1 >> 23 & 1 != 0 { flag::IDXEN } else { 0 };
    i
}

/// soffset may be an SGPR or an inline constant, never a literal; srsrc is four SGPRs.
fn buffer_soffset(i: Inst) -> Result<Inst, DecodeError> {
    if i.saddr == super::src::LITERAL {
        return Err(DecodeError("buffer soffset cannot be a literal".into()));
    }
    if !sgpr_tuple_ok(i.src[1], 4) {
        return Err(DecodeError(format!("buffer resource at SGPR code {}", i.src[1])));
    }
    Ok(i)
}

pub fn mubuf(w0: u32, w1: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 18) & 0xff) as u16;
    let name = mubuf_name(op).ok_or_else(|| DecodeError(format!("unknown MUBUF opcode {op:#x}")))?;
    let i = buffer_common(Inst::new(Fam::Mubuf, Enc::Mubuf, op), w0, w1);
    if op == 0x2b || op == 0x2c {
        // cache invalidations (no-ops here: memory is coherent); LLVM rejects them with glc,
        // tfe or an address mode
        if i.flags & (1 | flag::TFE | flag::OFFEN | flag::IDXEN) != 0 {
            return Err(DecodeError(format!("{name} with glc/tfe/offen/idxen")));
        }
        return Ok(Inst { len: 8, ..Inst::new(Fam::Cache, Enc::Mubuf, op) });
    }
    if name.contains("_atomic_") && i.flags & flag::TFE != 0 {
        return Err(DecodeError(format!("{name} with tfe")));
    }
    buffer_soffset(i)
}

pub fn mtbuf(w0: u32, w1: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 15) & 0xf) as u16;
    let mut i = buffer_common(Inst::new(Fam::Mtbuf, Enc::Mtbuf, op), w0, w1);
    i.op_y = ((w0 >> 19) & 0x7f) as u16;
    if i.flags & flag::TFE != 0 {
        return Err(DecodeError("MTBUF with tfe".into()));
    }
    buffer_soffset(i)
}

pub fn mimg(w0: u32, w: &dyn Fn(usize) -> Result<u32, DecodeError>) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 18) & 0xff) as u16;
    mimg_name(op).ok_or_else(|| DecodeError(format!("unknown MIMG opcode {op:#x}")))?;
    let w1 = w(1)?;
    let mut i = Inst::new(Fam::Mimg, Enc::Mimg, op);
    i.len = 8;
    i.imm = ((w0 >> 2) & 7) as i32;
    i.op_y = ((w0 >> 8) & 0xf) as u16;
    i.dst = ((w1 >> 8) & 0xff) as u16;
    i.src = [(w1 & 0xff) as u16, ((w1 >> 16) & 0x1f) as u16 * 4, ((w1 >> 26) & 0x1f) as u16 * 4];
    let bit = |w: u32, b: u32, f: u16| if w >> b & 1 != 0 { f } else { 0 };
    i.flags = cache_bits(w0)
        | bit(w0, 0, flag::NSA)
        | bit(w0, 7, flag::UNORM)
        | bit(w0, 15, flag::R128)
        | bit(w0, 16, flag::A16)
        | bit(w0, 17, flag::D16)
        | bit(w1, 21, flag::TFE)
        | bit(w1, 22, flag::LWE);
    let k = mimg_kind(mimg_name(op).unwrap_or(""));
    if !k.bvh && !sgpr_tuple_ok(i.src[1], 8)
        || k.bvh && !sgpr_tuple_ok(i.src[1], 4)
        || k.sampler && !sgpr_tuple_ok(i.src[2], 4)
    {
        return Err(DecodeError(format!("MIMG resource/sampler SGPR codes {}, {}", i.src[1], i.src[2])));
    }
    if !k.sampler && i.src[2] != 0 {
        return Err(DecodeError(format!("MIMG opcode {op:#x} takes no sampler but names s{}", i.src[2])));
    }
    if i.flags & flag::D16 != 0 && !k.d16 {
        return Err(DecodeError(format!("MIMG opcode {op:#x} has no d16 form")));
    }
    if i.flags & flag::NSA != 0 {
        // gfx11 NSA: one more dword holding up to four further address VGPRs
        i.lit = w(2)?;
        i.len = 12;
    }
    Ok(i)
}

pub fn exp(w0: u32, w1: u32) -> Result<Inst, DecodeError> {
    let mut i = Inst::new(Fam::Exp, Enc::Exp, ((w0 >> 4) & 0x3f) as u16);
    i.len = 8;
    i.imm = (w0 & 0xf) as i32;
    i.lit = w1;
    i.flags = if w0 >> 11 & 1 != 0 { flag::DONE } else { 0 } | if w0 >> 13 & 1 != 0 { flag::ROW_EN } else { 0 };
    Ok(i)
}

pub fn vinterp(w0: u32, w1: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 16) & 0x7f) as u16;
    vinterp_name(op).ok_or_else(|| DecodeError(format!("unknown VINTERP opcode {op:#x}")))?;
    let mut i = Inst::new(Fam::Vinterp, Enc::Vinterp, op);
    i.len = 8;
    i.dst = (w0 & 0xff) as u16;
    i.imm = ((w0 >> 8) & 7) as i32;
    i.opsel = ((w0 >> 11) & 0xf) as u8;
    i.clamp = w0 >> 15 & 1 != 0;
    i.src = [(w1 & 0x1ff) as u16, ((w1 >> 9) & 0x1ff) as u16, ((w1 >> 18) & 0x1ff) as u16];
    i.neg = ((w1 >> 29) & 7) as u8;
    Ok(i)
}

pub fn ldsdir(w0: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 20) & 3) as u16;
    ldsdir_name(op).ok_or_else(|| DecodeError(format!("unknown LDSDIR opcode {op}")))?;
    let mut i = Inst::new(Fam::Ldsdir, Enc::Ldsdir, op);
    i.dst = (w0 & 0xff) as u16;
    i.src = [((w0 >> 10) & 0x3f) as u16, ((w0 >> 8) & 3) as u16, 0];
    i.imm = ((w0 >> 16) & 0xf) as i32;
    Ok(i)
}

/// Data dwords of a MUBUF/MTBUF opcode, read off its name (without tfe).
pub fn buffer_data_dwords(name: &str) -> u8 {
    let cmpswap = if name.contains("cmpswap") { 2 } else { 1 };
    let base = if name.contains("d16_format") || name.contains("d16_hi_format") {
        if name.ends_with("_xyz") || name.ends_with("_xyzw") { 2 } else { 1 }
    } else if name.ends_with("format_xyzw") || name.ends_with("b128") {
        4
    } else if name.ends_with("format_xyz") || name.ends_with("b96") {
        3
    } else if name.ends_with("format_xy") || name.ends_with("64") {
        2
    } else {
        1
    };
    base * cmpswap
}

/// How a MIMG opcode uses its operands (LLVM's MIMGBaseOpcode fields, from the name).
#[derive(Clone, Copy, Debug, Default)]
pub struct MimgKind {
    pub sampler: bool,
    pub gather: bool,
    pub store: bool,
    pub atomic: bool,
    pub cmpswap: bool,
    pub bvh: bool,
    pub coords: bool,
    pub extra_args: u32,
    pub lod_clamp_mip: bool,
    pub gradients: bool,
    pub g16: bool,
    /// Has a d16 form (packed and atomic ops, resinfo and BVH have none).
    pub d16: bool,
}

pub fn mimg_kind(name: &str) -> MimgKind {
    let rest = name.trim_start_matches("image_");
    let t: Vec<&str> = rest.split('_').collect();
    let has = |s: &str| t[1..].contains(&s);
    let sampler = t[0] == "sample" || t[0].starts_with("gather4") || t[0] == "get" && has("lod");
    MimgKind {
        sampler,
        gather: t[0].starts_with("gather4") || t[0] == "msaa",
        store: t[0] == "store",
        atomic: t[0] == "atomic",
        cmpswap: has("cmpswap"),
        bvh: t[0].starts_with("bvh"),
        coords: !(t[0] == "get" && has("resinfo")),
        extra_args: has("o") as u32 + has("b") as u32 + has("c") as u32,
        lod_clamp_mip: has("l") || has("cl") || has("mip") || has("resinfo"),
        gradients: has("d"),
        g16: has("g16"),
        d16: !(has("pck") || t[0] == "atomic" || t[0] == "bvh" || t[0] == "bvh64" || t[0] == "get"),
    }
}

/// (coordinates, gradients) of SQ_RSRC_IMG_1D, 2D, 3D, CUBE, 1D_ARRAY, 2D_ARRAY, 2D_MSAA, 2D_MSAA_ARRAY.
const DIMS: [(u32, u32); 8] = [(1, 2), (2, 4), (3, 6), (3, 4), (2, 2), (3, 4), (3, 4), (4, 4)];

/// Address dwords of a MIMG instruction (LLVM's getAddrSizeMIMGOp; gfx11 has G16).
pub fn mimg_addr_dwords(k: &MimgKind, dim: usize, a16: bool) -> u32 {
    let (nc, ng) = DIMS[dim & 7];
    let comps = if k.coords { nc } else { 0 } + k.lod_clamp_mip as u32;
    let mut n = k.extra_args + if a16 { comps.div_ceil(2) } else { comps };
    if k.gradients {
        n += if k.g16 { (ng / 2).div_ceil(2) * 2 } else { ng };
    }
    n
}

/// Whether LLVM defines a variant of this opcode with `n` address dwords (a non-NSA register
/// tuple above 12 dwords is 16; NSA forms have at least two addresses, the fifth holding all
/// the rest).
pub fn mimg_addr_defined(k: &MimgKind, n: u32, nsa: bool) -> bool {
    // LLVM's address-size lists are contiguous: for sampling, fixed ranges (no MSAA
    // dimensions) plus the extra arguments; otherwise every dimension the opcode allows (no
    // MSAA for mip levels), with and without a16
    let (lo, hi) = if k.sampler {
        let lod = k.lod_clamp_mip as u32;
        let hi = if !k.gradients {
            3 + lod
        } else if k.g16 {
            7 + lod
        } else {
            9 + lod
        };
        (1 + k.gradients as u32 + k.extra_args, hi + k.extra_args)
    } else {
        let dims = if k.lod_clamp_mip { 6 } else { 8 };
        let sizes = || (0..dims).flat_map(|d| [false, true].map(|a| mimg_addr_dwords(k, d, a)));
        (sizes().min().unwrap_or(1), sizes().max().unwrap_or(1))
    };
    let listed = |n: u32| (lo..=hi).contains(&n);
    if nsa {
        return n >= 2 && listed(n);
    }
    // register tuples: 4 dwords also for 3, 8 for 5 to 7, 16 for 13 to 15
    listed(n) && n <= 12 || n == 4 && listed(3) || n == 8 && (5..=7).any(listed) || n == 16 && (13..=16).any(listed)
}

/// Whether LLVM defines a variant with `n` data dwords.
pub fn mimg_data_defined(k: &MimgKind, n: u32) -> bool {
    // (atomics: 32 or 64 bits, cmpswap twice that; tfe adds a dword)
    if k.cmpswap {
        (2..=5).contains(&n)
    } else if k.atomic {
        (1..=3).contains(&n)
    } else if k.gather && k.sampler {
        // gather4 (image_msaa_load has every size)
        matches!(n, 2 | 4 | 5)
    } else {
        (1..=5).contains(&n)
    }
}
