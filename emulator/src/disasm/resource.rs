//! Printing of the MUBUF, MTBUF, MIMG, EXP, VINTERP and LDSDIR encodings in
//! llvm-objdump-22's syntax (register widths follow LLVM's disassembler: the opcode's data
//! width, dmask, d16, tfe, and the dimension's address count).
use super::{operand, sreg};
use crate::decode::resource::{self as r, flag};
use crate::decode::{Fam, Inst, src};

fn vregs(first: u16, n: u32) -> String {
    operand(src::VGPR0 + (first & 0xff), n.max(1) as u8, 0, false, false)
}

fn cache(i: &Inst) -> String {
    let mut s = String::new();
    if i.flags & 1 != 0 {
        s += " glc";
    }
    if i.flags & 2 != 0 {
        s += " slc";
    }
    if i.flags & 4 != 0 {
        s += " dlc";
    }
    s
}

fn buffer(i: &Inst, name: &str) -> String {
    let mut n = r::buffer_data_dwords(name) as u32;
    if i.flags & flag::TFE != 0 {
        n += 1;
    }
    let (off, idx) = (i.flags & flag::OFFEN != 0, i.flags & flag::IDXEN != 0);
    let vaddr = if off || idx { vregs(i.src[0], if off && idx { 2 } else { 1 }) } else { "off".into() };
    let mut s =
        format!("{name} {}, {vaddr}, {}, {}", vregs(i.dst, n), sreg(i.src[1], 4), operand(i.saddr, 1, 0, false, false));
    if i.fam == Fam::Mtbuf && i.op_y != 1 {
        match r::ufmt_name(i.op_y) {
            Some(f) => s += &format!(" format:[{f}]"),
            None => s += &format!(" format:{}", i.op_y),
        }
    }
    if idx {
        s += " idxen";
    }
    if off {
        s += " offen";
    }
    if i.imm != 0 {
        s += &format!(" offset:{}", i.imm);
    }
    s += &cache(i);
    if i.flags & flag::TFE != 0 {
        s += " tfe";
    }
    s
}

const DIM: [&str; 8] = ["1D", "2D", "3D", "CUBE", "1D_ARRAY", "2D_ARRAY", "2D_MSAA", "2D_MSAA_ARRAY"];

/// NSA address VGPRs: vaddr0, then the bytes of the NSA dword.
fn nsa_reg(i: &Inst, k: usize) -> u16 {
    if k == 0 { i.src[0] } else { (i.lit >> (8 * (k - 1)) & 0xff) as u16 }
}

fn bvh(i: &Inst, name: &str) -> String {
    let a16 = i.flags & flag::A16 != 0;
    let b64 = name.contains("bvh64");
    // node pointer, ray extent, origin, direction, inverse direction (a16: dir and inv_dir packed)
    let parts: &[u32] = match (b64, a16) {
        (false, false) => &[1, 1, 3, 3, 3],
        (false, true) => &[1, 1, 3, 3],
        (true, false) => &[2, 1, 3, 3, 3],
        (true, true) => &[2, 1, 3, 3],
    };
    let vaddr = if i.flags & flag::NSA != 0 {
        let v: Vec<String> = parts.iter().enumerate().map(|(k, n)| vregs(nsa_reg(i, k), *n)).collect();
        format!("[{}]", v.join(", "))
    } else {
        vregs(i.src[0], parts.iter().sum())
    };
    let mut s = format!("{name} {}, {vaddr}, {}", vregs(i.dst, 4), sreg(i.src[1], 4));
    if a16 {
        s += " a16";
    }
    s
}

fn mimg(i: &Inst, name: &str) -> String {
    let k = r::mimg_kind(name);
    if k.bvh {
        return bvh(i, name);
    }
    let (dmask, dim) = (i.op_y as u32 & 0xf, i.imm as usize & 7);
    let nsa = i.flags & flag::NSA != 0;
    let mut data = if k.gather { 4 } else { dmask.count_ones().max(1) };
    if i.flags & flag::D16 != 0 {
        data = data.div_ceil(2);
    }
    if i.flags & flag::TFE != 0 {
        data += 1;
    }
    let mut addr = r::mimg_addr_dwords(&k, dim, i.flags & flag::A16 != 0);
    if !nsa && addr > 12 {
        addr = 16;
    }
    // Like LLVM: with no variant of these sizes, the one the decoder matched is printed (the
    // smallest data; the smallest address tuple, or for NSA the longest list of at most five).
    if !r::mimg_data_defined(&k, data) || !r::mimg_addr_defined(&k, addr, nsa) {
        // (image_msaa_load: four; an opcode with no NSA form at all, resinfo: four addresses)
        data = if k.gather && !k.sampler {
            4
        } else if k.cmpswap || k.gather {
            2
        } else {
            1
        };
        addr = if nsa {
            (2..=5).rev().find(|&n| r::mimg_addr_defined(&k, n, true)).unwrap_or(4)
        } else {
            (1..=16).find(|&n| r::mimg_addr_defined(&k, n, false)).unwrap_or(1)
        };
    }
    let vaddr = if nsa {
        // five address operands at most: the last one holds the remaining dwords
        let v: Vec<String> =
            (0..addr.min(5) as usize).map(|j| vregs(nsa_reg(i, j), if j == 4 { addr - 4 } else { 1 })).collect();
        format!("[{}]", v.join(", "))
    } else {
        vregs(i.src[0], addr)
    };
    let rsrc = sreg(i.src[1], 8);
    // (LLVM's NSA sampler asm strings put two spaces after the mnemonic)
    let mut s = format!("{name}{}{}, {vaddr}, {rsrc}", if nsa && k.sampler { "  " } else { " " }, vregs(i.dst, data));
    if k.sampler {
        s += &format!(", {}", sreg(i.src[2], 4));
    }
    if dmask != 0 {
        s += &format!(" dmask:{dmask:#x}");
    }
    s += &format!(" dim:SQ_RSRC_IMG_{}", DIM[dim]);
    if i.flags & flag::UNORM != 0 {
        s += " unorm";
    }
    s += &cache(i);
    if i.flags & flag::R128 != 0 {
        s += " r128";
    }
    if i.flags & flag::A16 != 0 {
        s += " a16";
    }
    if i.flags & flag::TFE != 0 {
        s += " tfe";
    }
    if i.flags & flag::LWE != 0 {
        s += " lwe";
    }
    if i.flags & flag::D16 != 0 {
        s += " d16";
    }
    s
}

fn exp(i: &Inst) -> String {
    let t = i.op;
    let target = match t {
        0..=7 => format!("mrt{t}"),
        8 => "mrtz".into(),
        12..=16 => format!("pos{}", t - 12),
        20 => "prim".into(),
        21 | 22 => format!("dual_src_blend{}", t - 21),
        _ => format!("invalid_target_{t}"),
    };
    let v: Vec<String> = (0..4)
        .map(|k| if i.imm >> k & 1 != 0 { vregs((i.lit >> (8 * k) & 0xff) as u16, 1) } else { "off".into() })
        .collect();
    let mut s = format!("exp {target} {}", v.join(", "));
    if i.flags & flag::DONE != 0 {
        s += " done";
    }
    if i.flags & flag::ROW_EN != 0 {
        s += " row_en";
    }
    s
}

fn vinterp(i: &Inst, name: &str) -> String {
    // shapes (dst, src0, src1, src2): 0x11 = a 16-bit half
    let sh: [u8; 4] = match i.op {
        2 | 4 => [1, 0x11, 1, 0x11],
        3 | 5 => [0x11, 0x11, 1, 1],
        _ => [1, 1, 1, 1],
    };
    let hi = |k: usize| i.opsel >> k & 1 != 0;
    let mut ops = vec![operand(src::VGPR0 + (i.dst & 0xff), sh[0], 0, hi(3), false)];
    for k in 0..3 {
        let o = operand(i.src[k], sh[k + 1], 0, hi(k), false);
        ops.push(if i.neg >> k & 1 != 0 { format!("-{o}") } else { o });
    }
    let mut s = format!("{name} {}", ops.join(", "));
    if i.clamp {
        s += " clamp";
    }
    // the f16 forms print op_sel as well as the .l/.h names (the f32 forms ignore it)
    if i.op >= 2 && i.opsel != 0 {
        s += &format!(" op_sel:[{},{},{},{}]", i.opsel & 1, i.opsel >> 1 & 1, i.opsel >> 2 & 1, i.opsel >> 3 & 1);
    }
    s + &format!(" wait_exp:{}", i.imm)
}

fn ldsdir(i: &Inst, name: &str) -> String {
    let d = vregs(i.dst, 1);
    if i.op == 0 {
        format!("{name} {d}, attr{}.{} wait_vdst:{}", i.src[0], ['x', 'y', 'z', 'w'][i.src[1] as usize & 3], i.imm)
    } else {
        format!("{name} {d} wait_vdst:{}", i.imm)
    }
}

/// Text of a resource-family instruction (None for the other families).
pub fn text(i: &Inst) -> Option<String> {
    let name = i.name();
    Some(match i.fam {
        Fam::Mubuf | Fam::Mtbuf => buffer(i, name),
        Fam::Mimg => mimg(i, name),
        Fam::Exp => exp(i),
        Fam::Vinterp => vinterp(i, name),
        Fam::Ldsdir => ldsdir(i, name),
        _ => return None,
    })
}
