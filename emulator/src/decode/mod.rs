//! Decoder: turns the dwords of a code object into compact [`Inst`]s, once per module.
//!
//! Every instruction is normalised so the executor needs no encoding knowledge:
//! VOP1/VOP2/VOPC and their VOP3 promotions share the VOP3 opcode space (VOPC 0x000+,
//! VOP2 0x100+, VOP1 0x180+); true16 `.h` halves of 32-bit encodings become `opsel` bits
//! (bit 0-2 sources, bit 3 destination) exactly like VOP3 `op_sel`; implicit VCC operands are
//! made explicit. The original encoding is kept in [`Enc`] for the disassembler.
mod mem;
pub mod resource;
mod resource_ops;
mod scalar;
mod vector;

use crate::optable::{self, OpDesc, ValuDesc};
use std::sync::OnceLock;

/// Instruction family (what the executor dispatches on first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fam {
    Sop2,
    Sopk,
    Sop1,
    Sopc,
    Sopp,
    Smem,
    Valu,
    Vop3p,
    Vopd,
    Ds,
    Flat,
    Global,
    Scratch,
    Invalid,
    Cache,
    // decoded for the disassembler; the executor refuses them by name (see `resource`)
    Mubuf,
    Mtbuf,
    Mimg,
    Exp,
    Vinterp,
    Ldsdir,
}

/// The encoding as written, for the disassembler and statistics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Enc {
    Sop2,
    Sopk,
    Sop1,
    Sopc,
    Sopp,
    Smem,
    Vop1,
    Vop2,
    Vopc,
    Vop3,
    Vop3sd,
    Vop3p,
    Vopd,
    Ds,
    Flat,
    Invalid,
    Mubuf,
    Mtbuf,
    Mimg,
    Exp,
    Vinterp,
    Ldsdir,
}

/// Data-parallel-primitive flavour of a VALU instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
// The variants are the ISA's own names (DPP16, DPP8, DPP8 with FI).
#[allow(clippy::enum_variant_names)]
pub enum Dpp {
    None,
    Dpp16,
    Dpp8,
    Dpp8Fi,
}

/// Special source operand codes (9-bit hardware operand encoding; 256+n = VGPR n).
pub mod src {
    pub const VCC_LO: u16 = 106;
    pub const NULL: u16 = 124;
    pub const M0: u16 = 125;
    pub const EXEC_LO: u16 = 126;
    pub const EXEC_HI: u16 = 127;
    pub const DPP8: u16 = 233;
    pub const DPP8FI: u16 = 234;
    pub const SHARED_BASE: u16 = 235;
    pub const SHARED_LIMIT: u16 = 236;
    pub const PRIVATE_BASE: u16 = 237;
    pub const PRIVATE_LIMIT: u16 = 238;
    pub const DPP16: u16 = 250;
    pub const VCCZ: u16 = 251;
    pub const EXECZ: u16 = 252;
    pub const SCC: u16 = 253;
    pub const LITERAL: u16 = 255;
    pub const VGPR0: u16 = 256;
}

/// One decoded instruction (plain data, copied freely).
#[derive(Clone, Copy, Debug)]
pub struct Inst {
    pub fam: Fam,
    pub enc: Enc,
    pub dpp_kind: Dpp,
    /// Length in bytes (4..=16).
    pub len: u8,
    /// Opcode in the family's opcode space (VALU: VOP3 space).
    pub op: u16,
    /// Destination: VGPR index for vector results, SGPR code for scalar results.
    pub dst: u16,
    /// Second scalar destination: VOP3SD carry-out / VOPC e32 VCC.
    pub sdst: u16,
    /// Source operand codes (9-bit, 256+n = VGPR n; 255 = `lit`).
    pub src: [u16; 3],
    pub lit: u32,
    /// SOPK/SOPP simm16 (sign-extended), SMEM/FLAT offset, DS offset0 | offset1 << 8.
    pub imm: i32,
    pub neg: u8,
    pub abs: u8,
    /// Bits 0-2: source high halves / packed op_sel; bit 3: destination high half.
    pub opsel: u8,
    pub opsel_hi: u8,
    pub neg_hi: u8,
    pub clamp: bool,
    pub omod: u8,
    /// DPP16 control word (bits 0-8 ctrl, 19 bound_ctrl, 24-27 bank mask, 28-31 row mask) or DPP8 selectors.
    pub dpp: u32,
    /// Memory flags: bit0 glc, bit1 slc, bit2 dlc, bit3 gds / sve; SMEM: soffset code in bits 8-15.
    pub flags: u16,
    /// FLAT/GLOBAL/SCRATCH scalar base (124 = off); SMEM soffset.
    pub saddr: u16,
    /// VOPD second half: opcode (VOP3 space), destination, src0, vsrc1.
    pub op_y: u16,
    pub dst_y: u16,
    pub src_y: [u16; 2],
    /// Operand shapes from the opcode table (see `optable`): dst, src0..2.
    pub shape: [u8; 4],
}

impl Inst {
    pub const INVALID: Inst = Inst {
        fam: Fam::Invalid,
        enc: Enc::Invalid,
        dpp_kind: Dpp::None,
        len: 4,
        op: 0,
        dst: 0,
        sdst: 0,
        src: [0; 3],
        lit: 0,
        imm: 0,
        neg: 0,
        abs: 0,
        opsel: 0,
        opsel_hi: 0,
        neg_hi: 0,
        clamp: false,
        omod: 0,
        dpp: 0,
        flags: 0,
        saddr: 124,
        op_y: 0,
        dst_y: 0,
        src_y: [0; 2],
        shape: [0; 4],
    };
    fn new(fam: Fam, enc: Enc, op: u16) -> Inst {
        Inst { fam, enc, op, ..Inst::INVALID }
    }
    /// Mnemonic as LLVM prints it (without encoding suffix decisions for VALU).
    pub fn name(&self) -> &'static str {
        match self.fam {
            Fam::Valu => valu_desc(self.op).map(|d| if d.n64.is_empty() { d.n32 } else { d.n64 }).unwrap_or("v_?"),
            Fam::Vopd => "v_dual",
            Fam::Invalid => "invalid",
            Fam::Cache | Fam::Mubuf => resource::mubuf_name(self.op).unwrap_or("buffer_?"),
            Fam::Mtbuf => resource::mtbuf_name(self.op).unwrap_or("tbuffer_?"),
            Fam::Mimg => resource::mimg_name(self.op).unwrap_or("image_?"),
            Fam::Exp => "exp",
            Fam::Vinterp => resource::vinterp_name(self.op).unwrap_or("v_interp_?"),
            Fam::Ldsdir => resource::ldsdir_name(self.op).unwrap_or("lds_?"),
            f => table_of(f).and_then(|t| t.get(self.op)).map(|d| d.name).unwrap_or("?"),
        }
    }
}

/// Why an instruction could not be decoded.
#[derive(Clone, Debug)]
pub struct DecodeError(pub String);

/// Sorted-by-opcode table with O(1) lookup.
pub struct Table {
    idx: Vec<u16>,
    descs: &'static [OpDesc],
}
impl Table {
    fn build(descs: &'static [OpDesc]) -> Table {
        let mut idx = vec![u16::MAX; 1024];
        for (i, d) in descs.iter().enumerate() {
            idx[d.op as usize] = i as u16;
        }
        Table { idx, descs }
    }
    pub fn get(&self, op: u16) -> Option<&'static OpDesc> {
        let i = *self.idx.get(op as usize)?;
        if i == u16::MAX { None } else { Some(&self.descs[i as usize]) }
    }
}

pub fn table_of(f: Fam) -> Option<&'static Table> {
    static T: OnceLock<Vec<Table>> = OnceLock::new();
    let t = T.get_or_init(|| {
        [
            optable::SOP2,
            optable::SOPK,
            optable::SOP1,
            optable::SOPC,
            optable::SOPP,
            optable::SMEM,
            optable::VOP3P,
            optable::DS,
            optable::FLAT,
            optable::GLOBAL,
            optable::SCRATCH,
        ]
        .iter()
        .map(|d| Table::build(d))
        .collect()
    });
    Some(
        &t[match f {
            Fam::Sop2 => 0,
            Fam::Sopk => 1,
            Fam::Sop1 => 2,
            Fam::Sopc => 3,
            Fam::Sopp => 4,
            Fam::Smem => 5,
            Fam::Vop3p => 6,
            Fam::Ds => 7,
            Fam::Flat => 8,
            Fam::Global => 9,
            Fam::Scratch => 10,
            _ => return None,
        }],
    )
}

/// VALU opcode descriptor by VOP3-space opcode.
pub fn valu_desc(op: u16) -> Option<&'static ValuDesc> {
    static T: OnceLock<Vec<Option<&'static ValuDesc>>> = OnceLock::new();
    let t = T.get_or_init(|| {
        let mut v = vec![None; 1024];
        for d in optable::VALU.iter().chain(optable::VALU32_ONLY.iter()) {
            v[d.op as usize] = Some(d);
        }
        v
    });
    t.get(op as usize).copied().flatten()
}

/// Source operand codes no gfx11 instruction accepts (LLVM rejects the encoding).
fn reserved_src(code: u16) -> bool {
    matches!(code, 209..=229 | 232 | 249)
}

/// Decode one instruction at `words[0..]` (as many dwords as it needs are read).
pub fn decode(words: &[u32]) -> Result<Inst, DecodeError> {
    let i = decode_fields(words)?;
    let used = match i.fam {
        Fam::Valu | Fam::Vop3p => (0..3).filter(|&k| i.shape[k + 1] != 0).map(|k| i.src[k]).collect::<Vec<_>>(),
        Fam::Vopd => vec![i.src[0], i.src_y[0]],
        _ => Vec::new(),
    };
    if let Some(c) = used.into_iter().find(|&c| reserved_src(c)) {
        return Err(DecodeError(format!("{}: source operand code {c} is reserved", i.name())));
    }
    Ok(i)
}

fn decode_fields(words: &[u32]) -> Result<Inst, DecodeError> {
    let w0 = *words.first().ok_or_else(|| DecodeError("end of code".into()))?;
    let w = |i: usize| words.get(i).copied().ok_or_else(|| DecodeError("instruction runs past the end of code".into()));
    if w0 == 0 {
        return Err(DecodeError("v_illegal (the all-zero word)".into()));
    }
    match w0 >> 25 {
        0x3f => return vector::vop1(w0, &w),
        0x3e => return vector::vopc(w0, &w),
        x if x < 0x3e => return vector::vop2(w0, &w),
        _ => {}
    }
    match w0 >> 23 {
        0x17d => return scalar::sop1(w0, &w),
        0x17e => return scalar::sopc(w0, &w),
        0x17f => return scalar::sopp(w0),
        _ => {}
    }
    match w0 >> 28 {
        0xb => return scalar::sopk(w0, &w),
        0x8..=0xa => return scalar::sop2(w0, &w),
        _ => {}
    }
    match w0 >> 26 {
        0x3d => scalar::smem(w0, w(1)?),
        0x35 => vector::vop3(w0, &w),
        // bits 31:24: 0xcc VOP3P, 0xcd VINTERP, 0xce LDSDIR (one word)
        0x33 => match w0 >> 24 {
            0xcc => vector::vop3p(w0, &w),
            0xcd => resource::vinterp(w0, w(1)?),
            0xce => resource::ldsdir(w0),
            x => Err(DecodeError(format!("no gfx11 encoding has bits 31:24 = {x:#x}"))),
        },
        0x32 => vector::vopd(w0, &w),
        0x36 => mem::ds(w0, w(1)?),
        0x38 => resource::mubuf(w0, w(1)?),
        0x37 => mem::flat(w0, w(1)?),
        0x3a => resource::mtbuf(w0, w(1)?),
        0x3c => resource::mimg(w0, &w),
        0x3e => resource::exp(w0, w(1)?),
        x => Err(DecodeError(format!("no gfx11 encoding has bits 31:26 = {x:#x}"))),
    }
}

/// How many dwords of an undecodable instruction an error shows: both words of the 64-bit
/// encodings (bits 31:26 from 0x32: VOPD, VOP3P, VOP3, DS, FLAT, MUBUF, MTBUF, MIMG, SMEM,
/// EXP, VINTERP), the first word otherwise (LDSDIR is one word).
pub fn shown_words(w0: u32) -> usize {
    if w0 >> 26 >= 0x32 && w0 >> 26 != 0x3f && w0 >> 24 != 0xce { 2 } else { 1 }
}

/// Length-in-dwords helper for sources that may carry a literal.
pub(crate) fn uses_literal(src: &[u16]) -> bool {
    src.contains(&src::LITERAL)
}
