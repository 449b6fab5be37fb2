//! VOP1/VOP2/VOPC/VOP3/VOP3SD/VOP3P/VOPD decoding, with DPP16/DPP8 and literals.
use super::{DecodeError, Dpp, Enc, Fam, Inst, src, valu_desc};
use crate::optable::vop;

type W<'a> = &'a dyn Fn(usize) -> Result<u32, DecodeError>;

/// VOP2 opcodes (VOP3 space) that always carry a literal constant K.
pub fn is_fmak(op: u16) -> bool {
    matches!(op, vop::V_FMAMK_F32 | vop::V_FMAAK_F32 | vop::V_FMAMK_F16 | vop::V_FMAAK_F16)
}

fn shapes(op: u16, what: &str, _w0: u32) -> Result<[u8; 4], DecodeError> {
    match valu_desc(op) {
        Some(d) => Ok([d.dst, d.src[0], d.src[1], d.src[2]]),
        None => Err(DecodeError(format!("unknown {what} opcode {:#x}", op))),
    }
}

/// Move the true16 high-half bit (VGPR index bit 7) of 16-bit operands into `opsel`.
fn true16(i: &mut Inst, dst_is_vgpr: bool) {
    for k in 0..3 {
        if i.shape[k + 1] & 0x10 != 0 && i.src[k] >= src::VGPR0 && i.src[k] & 0x80 != 0 {
            i.src[k] &= !0x80;
            i.opsel |= 1 << k;
        }
    }
    if dst_is_vgpr && i.shape[0] & 0x10 != 0 && i.dst & 0x80 != 0 {
        i.dst &= 0x7f;
        i.opsel |= 8;
    }
}

/// Read the DPP/literal words that follow a 32-bit VALU word.
fn tail32(mut i: Inst, w: W) -> Result<Inst, DecodeError> {
    match i.src[0] {
        src::DPP16 => {
            let d = w(1)?;
            i.dpp_kind = Dpp::Dpp16;
            i.src[0] = src::VGPR0 + (d & 0xff) as u16;
            i.dpp = d;
            // DPP word neg/abs bits for src0/src1
            i.neg |= (((d >> 20) & 1) | (((d >> 22) & 1) << 1)) as u8;
            i.abs |= (((d >> 21) & 1) | (((d >> 23) & 1) << 1)) as u8;
            i.len = 8;
        }
        src::DPP8 | src::DPP8FI => {
            let d = w(1)?;
            i.dpp_kind = if i.src[0] == src::DPP8 { Dpp::Dpp8 } else { Dpp::Dpp8Fi };
            i.src[0] = src::VGPR0 + (d & 0xff) as u16;
            i.dpp = d >> 8;
            i.len = 8;
        }
        _ => {
            if super::uses_literal(&i.src) || is_fmak(i.op) {
                i.lit = w(1)?;
                i.len = 8;
            }
        }
    }
    Ok(i)
}

pub fn vop1(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let op = 0x180 + ((w0 >> 9) & 0xff) as u16;
    let mut i = Inst::new(Fam::Valu, Enc::Vop1, op);
    i.shape = shapes(op, "VOP1", w0)?;
    i.dst = ((w0 >> 17) & 0xff) as u16;
    i.src = [(w0 & 0x1ff) as u16, 0, 0];
    let mut i = tail32(i, w)?;
    let dv = i.shape[0] & 0x20 == 0;
    true16(&mut i, dv);
    Ok(i)
}

pub fn vop2(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let op = 0x100 + ((w0 >> 25) & 0x3f) as u16;
    let mut i = Inst::new(Fam::Valu, Enc::Vop2, op);
    i.shape = shapes(op, "VOP2", w0)?;
    i.dst = ((w0 >> 17) & 0xff) as u16;
    i.src = [(w0 & 0x1ff) as u16, src::VGPR0 + ((w0 >> 9) & 0xff) as u16, 0];
    match op {
        // implicit VCC carry-in / select mask, VCC carry-out
        vop::V_CNDMASK_B32 => i.src[2] = src::VCC_LO,
        vop::V_ADD_CO_CI_U32 | vop::V_SUB_CO_CI_U32 | vop::V_SUBREV_CO_CI_U32 => {
            i.src[2] = src::VCC_LO;
            i.sdst = src::VCC_LO;
        }
        _ => {}
    }
    let mut i = tail32(i, w)?;
    true16(&mut i, true);
    Ok(i)
}

pub fn vopc(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 17) & 0xff) as u16;
    let mut i = Inst::new(Fam::Valu, Enc::Vopc, op);
    i.shape = shapes(op, "VOPC", w0)?;
    i.dst = src::VCC_LO;
    i.src = [(w0 & 0x1ff) as u16, src::VGPR0 + ((w0 >> 9) & 0xff) as u16, 0];
    let mut i = tail32(i, w)?;
    true16(&mut i, false);
    Ok(i)
}

/// VOP3SD opcodes: bits 14:8 hold a scalar destination instead of abs/op_sel.
fn is_vop3sd(op: u16) -> bool {
    matches!(op, vop::V_ADD_CO_CI_U32 | vop::V_SUB_CO_CI_U32 | vop::V_SUBREV_CO_CI_U32)
        || valu_desc(op).is_some_and(|d| d.sdst)
}

pub fn vop3(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let w1 = w(1)?;
    let op = ((w0 >> 16) & 0x3ff) as u16;
    let sd = is_vop3sd(op);
    let mut i = Inst::new(Fam::Valu, if sd { Enc::Vop3sd } else { Enc::Vop3 }, op);
    i.shape = shapes(op, "VOP3", w0)?;
    i.len = 8;
    i.dst = (w0 & 0xff) as u16;
    if sd {
        i.sdst = ((w0 >> 8) & 0x7f) as u16;
    } else {
        i.abs = ((w0 >> 8) & 7) as u8;
        i.opsel = ((w0 >> 11) & 0xf) as u8;
    }
    i.clamp = (w0 >> 15) & 1 != 0;
    i.src = [(w1 & 0x1ff) as u16, ((w1 >> 9) & 0x1ff) as u16, ((w1 >> 18) & 0x1ff) as u16];
    i.omod = ((w1 >> 27) & 3) as u8;
    i.neg = ((w1 >> 29) & 7) as u8;
    match i.src[0] {
        src::DPP16 => {
            let d = w(2)?;
            i.dpp_kind = Dpp::Dpp16;
            i.src[0] = src::VGPR0 + (d & 0xff) as u16;
            i.dpp = d;
            i.len = 12;
        }
        src::DPP8 | src::DPP8FI => {
            let d = w(2)?;
            i.dpp_kind = if i.src[0] == src::DPP8 { Dpp::Dpp8 } else { Dpp::Dpp8Fi };
            i.src[0] = src::VGPR0 + (d & 0xff) as u16;
            i.dpp = d >> 8;
            i.len = 12;
        }
        _ => {
            if super::uses_literal(&i.src) {
                i.lit = w(2)?;
                i.len = 12;
            }
        }
    }
    Ok(i)
}

pub fn vop3p(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let w1 = w(1)?;
    let op = ((w0 >> 16) & 0x7f) as u16;
    let mut i = Inst::new(Fam::Vop3p, Enc::Vop3p, op);
    let d = super::table_of(Fam::Vop3p)
        .and_then(|t| t.get(op))
        .ok_or_else(|| DecodeError(format!("unknown VOP3P opcode {op:#x}")))?;
    i.shape = [d.dst, d.src[0], d.src[1], d.src[2]];
    i.len = 8;
    i.dst = (w0 & 0xff) as u16;
    i.neg_hi = ((w0 >> 8) & 7) as u8;
    i.opsel = ((w0 >> 11) & 7) as u8;
    i.opsel_hi = (((w1 >> 27) & 3) | (((w0 >> 14) & 1) << 2)) as u8;
    i.clamp = (w0 >> 15) & 1 != 0;
    i.src = [(w1 & 0x1ff) as u16, ((w1 >> 9) & 0x1ff) as u16, ((w1 >> 18) & 0x1ff) as u16];
    i.neg = ((w1 >> 29) & 7) as u8;
    if i.src[0] == src::DPP16 || i.src[0] == src::DPP8 || i.src[0] == src::DPP8FI {
        // gfx11 has DPP forms only of the dot2 f32 and fma_mix opcodes (LLVM lists the rest as words)
        if !matches!(op, 19 | 26 | 32..=34) {
            return Err(DecodeError(format!("{}: no DPP form", d.name)));
        }
        let dw = w(2)?;
        i.dpp_kind = match i.src[0] {
            src::DPP16 => Dpp::Dpp16,
            src::DPP8 => Dpp::Dpp8,
            _ => Dpp::Dpp8Fi,
        };
        i.src[0] = src::VGPR0 + (dw & 0xff) as u16;
        i.dpp = if i.dpp_kind == Dpp::Dpp16 { dw } else { dw >> 8 };
        i.len = 12;
        return Ok(i);
    }
    if super::uses_literal(&i.src) {
        i.lit = w(2)?;
        i.len = 12;
    }
    Ok(i)
}

/// VOPD component opcodes mapped into the VOP3 opcode space.
pub fn vopd_op(x: u16) -> Option<u16> {
    Some(match x {
        0 => vop::V_FMAC_F32,
        1 => vop::V_FMAAK_F32,
        2 => vop::V_FMAMK_F32,
        3 => vop::V_MUL_F32,
        4 => vop::V_ADD_F32,
        5 => vop::V_SUB_F32,
        6 => vop::V_SUBREV_F32,
        7 => vop::V_MUL_DX9_ZERO_F32,
        8 => vop::V_MOV_B32,
        9 => vop::V_CNDMASK_B32,
        10 => vop::V_MAX_F32,
        11 => vop::V_MIN_F32,
        12 => vop::V_DOT2ACC_F32_F16,
        16 => vop::V_ADD_NC_U32,
        17 => vop::V_LSHLREV_B32,
        18 => vop::V_AND_B32,
        _ => return None,
    })
}

pub fn vopd(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let w1 = w(1)?;
    let (ox, oy) = (((w0 >> 22) & 0xf) as u16, ((w0 >> 17) & 0x1f) as u16);
    let bad = |o| DecodeError(format!("unsupported VOPD opcode {o}"));
    let opx = vopd_op(ox).ok_or_else(|| bad(ox))?;
    let opy = vopd_op(oy).filter(|_| oy != 13).ok_or_else(|| bad(oy))?;
    let mut i = Inst::new(Fam::Vopd, Enc::Vopd, opx);
    i.len = 8;
    i.op_y = opy;
    i.src = [(w0 & 0x1ff) as u16, src::VGPR0 + ((w0 >> 9) & 0xff) as u16, 0];
    i.src_y = [(w1 & 0x1ff) as u16, src::VGPR0 + ((w1 >> 9) & 0xff) as u16];
    i.dst = (w1 >> 24) as u16;
    i.dst_y = ((((w1 >> 17) & 0x7f) << 1) | ((i.dst as u32 & 1) ^ 1)) as u16;
    if i.src[0] == src::LITERAL || i.src_y[0] == src::LITERAL || is_fmak(opx) || is_fmak(opy) {
        i.lit = w(2)?;
        i.len = 12;
    }
    Ok(i)
}
