//! DS (LDS) and FLAT/GLOBAL/SCRATCH decoding.
use super::{DecodeError, Enc, Fam, Inst, table_of};

pub fn ds(w0: u32, w1: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 18) & 0xff) as u16;
    let mut i = Inst::new(Fam::Ds, Enc::Ds, op);
    let d = table_of(Fam::Ds).and_then(|t| t.get(op)).ok_or_else(|| DecodeError(format!("unknown DS opcode {op}")))?;
    i.shape = [d.dst, d.src[0], d.src[1], d.src[2]];
    i.flags = (((w0 >> 17) & 1) << 3) as u16;
    if i.flags != 0 && matches!(op, 20 | 173 | 178 | 179) {
        return Err(DecodeError(format!("{} has no gds form", d.name)));
    }
    // GWS, ordered-count and GS-register opcodes exist only with gds
    if i.flags == 0 && matches!(op, 24..=29 | 63 | 122 | 123) {
        return Err(DecodeError(format!("{} is only a gds instruction", d.name)));
    }
    i.len = 8;
    i.imm = (w0 & 0xffff) as i32;
    i.src = [(w1 & 0xff) as u16, ((w1 >> 8) & 0xff) as u16, ((w1 >> 16) & 0xff) as u16];
    i.dst = (w1 >> 24) as u16;
    // the register fields an opcode does not use are zero (LLVM lists the word otherwise)
    let unused = (0..3).any(|k| i.shape[k + 1] == 0 && i.src[k] != 0) || (i.shape[0] == 0 && i.dst != 0);
    if unused {
        return Err(DecodeError(format!("{}: an unused register field is not zero", d.name)));
    }
    Ok(i)
}

pub fn flat(w0: u32, w1: u32) -> Result<Inst, DecodeError> {
    let op = ((w0 >> 18) & 0x7f) as u16;
    let (fam, what) = match (w0 >> 16) & 3 {
        0 => (Fam::Flat, "FLAT"),
        1 => (Fam::Scratch, "SCRATCH"),
        2 => (Fam::Global, "GLOBAL"),
        _ => return Err(DecodeError("FLAT segment 3 is not an encoding".into())),
    };
    let mut i = Inst::new(fam, Enc::Flat, op);
    let d = table_of(fam).and_then(|t| t.get(op)).ok_or_else(|| DecodeError(format!("unknown {what} opcode {op}")))?;
    i.shape = [d.dst, d.src[0], d.src[1], d.src[2]];
    i.len = 8;
    i.imm = ((w0 & 0x1fff) << 19) as i32 >> 19;
    i.flags = (((w0 >> 14) & 1) | (((w0 >> 15) & 1) << 1) | (((w0 >> 13) & 1) << 2) | (((w1 >> 23) & 1) << 3)) as u16;
    i.src = [(w1 & 0xff) as u16, ((w1 >> 8) & 0xff) as u16, 0];
    i.saddr = ((w1 >> 16) & 0x7f) as u16;
    i.dst = (w1 >> 24) as u16;
    Ok(i)
}
