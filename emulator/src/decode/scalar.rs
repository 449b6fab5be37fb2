//! SOP1/SOP2/SOPK/SOPC/SOPP and SMEM decoding (field layout: LLVM AMDGPUUsage / RDNA3 ISA).
use super::{DecodeError, Enc, Fam, Inst, src, table_of};

type W<'a> = &'a dyn Fn(usize) -> Result<u32, DecodeError>;

fn known(f: Fam, op: u16, what: &str, _w0: u32) -> Result<[u8; 4], DecodeError> {
    match table_of(f).and_then(|t| t.get(op)) {
        Some(d) => Ok([d.dst, d.src[0], d.src[1], d.src[2]]),
        None => Err(DecodeError(format!("unknown {what} opcode {op}"))),
    }
}

fn with_literal(mut i: Inst, w: W) -> Result<Inst, DecodeError> {
    if super::uses_literal(&i.src[..2]) {
        i.lit = w(1)?;
        i.len = 8;
    }
    Ok(i)
}

pub fn sop2(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 23) & 0x7f) as u16;
    let mut i = Inst::new(Fam::Sop2, Enc::Sop2, op);
    i.shape = known(Fam::Sop2, op, "SOP2", w0)?;
    i.dst = ((w0 >> 16) & 0x7f) as u16;
    i.src = [(w0 & 0xff) as u16, ((w0 >> 8) & 0xff) as u16, 0];
    with_literal(i, w)
}

pub fn sopk(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 23) & 0x1f) as u16;
    let mut i = Inst::new(Fam::Sopk, Enc::Sopk, op);
    i.shape = known(Fam::Sopk, op, "SOPK", w0)?;
    i.dst = ((w0 >> 16) & 0x7f) as u16;
    i.imm = (w0 & 0xffff) as u16 as i16 as i32;
    if op == 0x13 {
        // s_setreg_imm32_b32 carries a literal
        i.lit = w(1)?;
        i.len = 8;
    }
    Ok(i)
}

pub fn sop1(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 8) & 0xff) as u16;
    let mut i = Inst::new(Fam::Sop1, Enc::Sop1, op);
    i.shape = known(Fam::Sop1, op, "SOP1", w0)?;
    i.dst = ((w0 >> 16) & 0x7f) as u16;
    i.src = [(w0 & 0xff) as u16, 0, 0];
    with_literal(i, w)
}

pub fn sopc(w0: u32, w: W) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 16) & 0x7f) as u16;
    let mut i = Inst::new(Fam::Sopc, Enc::Sopc, op);
    i.shape = known(Fam::Sopc, op, "SOPC", w0)?;
    i.src = [(w0 & 0xff) as u16, ((w0 >> 8) & 0xff) as u16, 0];
    with_literal(i, w)
}

pub fn sopp(w0: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 16) & 0x7f) as u16;
    let mut i = Inst::new(Fam::Sopp, Enc::Sopp, op);
    known(Fam::Sopp, op, "SOPP", w0)?;
    i.imm = (w0 & 0xffff) as u16 as i16 as i32;
    Ok(i)
}

pub fn smem(w0: u32, w1: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 18) & 0xff) as u16;
    let mut i = Inst::new(Fam::Smem, Enc::Smem, op);
    i.shape = known(Fam::Smem, op, "SMEM", w0)?;
    i.len = 8;
    i.dst = ((w0 >> 6) & 0x7f) as u16;
    i.src = [((w0 & 0x3f) << 1) as u16, 0, 0];
    i.flags = (((w0 >> 14) & 1) | (((w0 >> 13) & 1) << 2)) as u16;
    i.saddr = (w1 >> 25) as u16;
    // 21-bit signed byte offset
    i.imm = ((w1 & 0x1f_ffff) << 11) as i32 >> 11;
    let _ = src::NULL;
    Ok(i)
}
