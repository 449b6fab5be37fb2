//! Disassembler printing the LLVM syntax of `llvm-objdump-22 -d --mcpu=gfx1100` (the
//! instruction column). Used for `disassemble()` and in every error message.
use crate::decode::{self, Dpp, Enc, Fam, Inst, src, valu_desc};
use crate::error::EmuError;
use std::fmt::Write;

mod resource;

fn sreg(code: u16, n: u8) -> String {
    let n = n.max(1) as u16;
    let named = |lo: &str, pair: &str| if n == 2 { pair.to_string() } else { lo.to_string() };
    match code {
        0..=105 => {
            if n == 1 {
                format!("s{code}")
            } else {
                format!("s[{}:{}]", code, code + n - 1)
            }
        }
        106 => named("vcc_lo", "vcc"),
        107 => "vcc_hi".into(),
        108..=123 => {
            if n == 1 {
                format!("ttmp{}", code - 108)
            } else {
                format!("ttmp[{}:{}]", code - 108, code - 108 + n - 1)
            }
        }
        124 => "null".into(),
        125 => "m0".into(),
        126 => named("exec_lo", "exec"),
        127 => "exec_hi".into(),
        _ => format!("?{code}"),
    }
}

/// Print a 9-bit source operand. `sh` = shape byte (dwords | 0x10 half), `hi` true16 half,
/// `int16`: an operand of a 16-bit integer op (whose inline constants are integers only).
fn operand(code: u16, sh: u8, lit: u32, hi: bool, int16: bool) -> String {
    let n = (sh & 0xf).max(1);
    if code >= src::VGPR0 {
        let r = code - src::VGPR0;
        if sh & 0x10 != 0 {
            return format!("v{r}.{}", if hi { 'h' } else { 'l' });
        }
        return if n == 1 { format!("v{r}") } else { format!("v[{}:{}]", r, r + n as u16 - 1) };
    }
    match code {
        0..=127 => sreg(code, n),
        128..=192 => format!("{}", code - 128),
        193..=208 => format!("-{}", code - 192),
        240 => "0.5".into(),
        241 => "-0.5".into(),
        242 => "1.0".into(),
        243 => "-1.0".into(),
        244 => "2.0".into(),
        245 => "-2.0".into(),
        246 => "4.0".into(),
        247 => "-4.0".into(),
        248 => "0.15915494".into(),
        src::SHARED_BASE => "src_shared_base".into(),
        src::SHARED_LIMIT => "src_shared_limit".into(),
        src::PRIVATE_BASE => "src_private_base".into(),
        src::PRIVATE_LIMIT => "src_private_limit".into(),
        230 => "src_flat_scratch_base_lo".into(),
        231 => "src_flat_scratch_base_hi".into(),
        239 => "src_pops_exiting_wave_id".into(),
        254 => "src_lds_direct".into(),
        src::VCCZ => "src_vccz".into(),
        src::EXECZ => "src_execz".into(),
        src::SCC => "src_scc".into(),
        src::LITERAL => {
            // LLVM marks literals that could have been inline constants
            let inline = if sh & 0x10 != 0 && int16 {
                // e.g. `v_add_nc_u16 v0.h, 0x4000, v1.l`: f16 bit patterns are not inline here.
                lit >> 16 == 0 && (lit & 0xffff) <= 64
            } else if sh & 0x10 != 0 {
                let h = lit & 0xffff;
                lit >> 16 == 0
                    && ([0x3800, 0xb800, 0x3c00, 0xbc00, 0x4000, 0xc000, 0x4400, 0xc400, 0x3118].contains(&h)
                        || h <= 64)
            } else if n == 2 {
                // A 64-bit integer operand zero-extends its 32-bit literal: 0xffffffff is not
                // the inline -1, so llvm-objdump prints it bare (`s_mov_b64 s[16:17], 0xffffffff`).
                lit <= 64
            } else {
                (lit as i32) >= -16 && (lit as i32) <= 64
                    || [0.5f32, -0.5, 1.0, -1.0, 2.0, -2.0, 4.0, -4.0].iter().any(|f| f.to_bits() == lit)
                    || lit == 0x3e22f983
            };
            // A 16-bit operand reads the literal's low half (LLVM prints just that).
            let shown = if sh & 0x10 != 0 { lit & 0xffff } else { lit };
            if inline { format!("lit({shown:#x})") } else { format!("{shown:#x}") }
        }
        _ => format!("?{code}"),
    }
}

fn vdst(i: &Inst) -> String {
    let sh = i.shape[0];
    if sh & 0x20 != 0 {
        return sreg(i.dst, sh & 0xf);
    }
    operand(src::VGPR0 + i.dst, sh, 0, i.opsel & 8 != 0, false)
}

fn mods(s: String, k: usize, i: &Inst) -> String {
    let s = if i.abs >> k & 1 != 0 { format!("|{s}|") } else { s };
    if i.neg >> k & 1 != 0 { format!("-{s}") } else { s }
}

fn dpp_suffix(i: &Inst) -> String {
    match i.dpp_kind {
        Dpp::None => String::new(),
        Dpp::Dpp8 | Dpp::Dpp8Fi => {
            let sel: Vec<String> = (0..8).map(|k| ((i.dpp >> (3 * k)) & 7).to_string()).collect();
            format!(" dpp8:[{}]{}", sel.join(","), if i.dpp_kind == Dpp::Dpp8Fi { " fi:1" } else { "" })
        }
        Dpp::Dpp16 => {
            let c = i.dpp >> 8 & 0x1ff;
            let ctrl = match c {
                0..=0xff => format!("quad_perm:[{},{},{},{}]", c & 3, c >> 2 & 3, c >> 4 & 3, c >> 6 & 3),
                0x101..=0x10f => format!("row_shl:{}", c & 15),
                0x111..=0x11f => format!("row_shr:{}", c & 15),
                0x121..=0x12f => format!("row_ror:{}", c & 15),
                0x140 => "row_mirror".into(),
                0x141 => "row_half_mirror".into(),
                0x150..=0x15f => format!("row_share:{}", c & 15),
                0x160..=0x16f => format!("row_xmask:{}", c & 15),
                0x130 => "/* wave_shl is not supported starting from GFX10 */".into(),
                0x134 => "/* wave_rol is not supported starting from GFX10 */".into(),
                0x138 => "/* wave_shr is not supported starting from GFX10 */".into(),
                0x13c => "/* wave_ror is not supported starting from GFX10 */".into(),
                0x142 | 0x143 => "/* row_bcast is not supported starting from GFX10 */".into(),
                _ => "/* Invalid dpp_ctrl value */".into(),
            };
            let mut s = format!(" {ctrl} row_mask:{:#x} bank_mask:{:#x}", i.dpp >> 28, i.dpp >> 24 & 0xf);
            if i.dpp >> 19 & 1 != 0 {
                s += " bound_ctrl:1";
            }
            if i.dpp >> 18 & 1 != 0 {
                s += " fi:1";
            }
            s
        }
    }
}

fn valu_text(i: &Inst) -> String {
    let Some(d) = valu_desc(i.op) else { return format!("v_unknown_{:#x}", i.op) };
    let vop3 = matches!(i.enc, Enc::Vop3 | Enc::Vop3sd);
    let mut name = if vop3 { d.n64.to_string() } else { d.n32.to_string() };
    if i.dpp_kind != Dpp::None {
        name = if vop3 {
            if name.ends_with("_e64") { format!("{name}_dpp") } else { format!("{name}_e64_dpp") }
        } else {
            format!("{}_dpp", name.trim_end_matches("_e32"))
        };
    }
    let int16 = name.contains("_u16") || name.contains("_i16");
    let mut ops: Vec<String> = Vec::new();
    let is_cmpx = name.starts_with("v_cmpx");
    if !is_cmpx && (d.dst != 0 || i.enc == Enc::Vopc) {
        if i.enc == Enc::Vopc {
            ops.push("vcc_lo".into());
        } else {
            ops.push(vdst(i));
        }
    }
    if i.enc == Enc::Vop3sd || (i.sdst != 0 && i.enc == Enc::Vop2) {
        ops.push(sreg(i.sdst, 1));
    }
    let is_fmamk = name.starts_with("v_fmamk");
    for k in 0..3 {
        let sh = d.src[k];
        if sh == 0 {
            continue;
        }
        if is_fmamk && k == 1 {
            ops.push(format!("{:#x}", i.lit));
        }
        let hi = i.opsel >> k & 1 != 0 && sh & 0x10 != 0;
        ops.push(mods(operand(i.src[k], sh, i.lit, hi, int16), k, i));
    }
    if name.starts_with("v_fmaak") {
        ops.push(format!("{:#x}", i.lit));
    }
    let mut s = name;
    if !ops.is_empty() {
        s += " ";
        s += &ops.join(", ");
    }
    if vop3 {
        // op_sel only printed when it is not implied by true16 operand names
        let nsrc = d.src.iter().filter(|&&x| x != 0).count();
        let any16 = d.src.iter().any(|x| x & 0x10 != 0) || d.dst & 0x10 != 0;
        // LLVM gives v_cndmask_b16 no destination op_sel (its VOP3 form lacks the VOP3_OPSEL
        // flag): a `.h` destination shows only in the register name, and source bits alone
        // print.
        let no_dst_sel = s.starts_with("v_cndmask_b16");
        if i.opsel != 0 && !(no_dst_sel && i.opsel & 0b111 == 0) {
            let mut bits: Vec<String> = (0..nsrc).map(|k| (i.opsel >> k & 1).to_string()).collect();
            if any16 && !no_dst_sel {
                bits.push((i.opsel >> 3 & 1).to_string());
            }
            s += &format!(" op_sel:[{}]", bits.join(","));
        }
        if i.clamp {
            s += " clamp";
        }
        match i.omod {
            1 => s += " mul:2",
            2 => s += " mul:4",
            3 => s += " div:2",
            _ => {}
        }
    }
    s + &dpp_suffix(i)
}

fn vop3p_text(i: &Inst) -> String {
    let d = decode::table_of(Fam::Vop3p).and_then(|t| t.get(i.op));
    let Some(d) = d else { return format!("v_pk_unknown_{:#x}", i.op) };
    let mut ops = vec![operand(src::VGPR0 + i.dst, d.dst, 0, false, false)];
    let nsrc = d.src.iter().filter(|&&x| x != 0).count();
    let mix = d.name.starts_with("v_fma_mix");
    for k in 0..nsrc {
        let mut o = operand(i.src[k], d.src[k], i.lit, false, false);
        if mix && k == 1 && i.dpp_kind != Dpp::None && i.src[1] < src::VGPR0 {
            // fma_mix DPP takes src1 from a VGPR only; LLVM prints the operand with its complaint
            o += "/*Invalid register, operand has 'VGPR_32' register class*/";
        }
        if mix {
            if i.neg_hi >> k & 1 != 0 {
                o = format!("|{o}|");
            }
            if i.neg >> k & 1 != 0 {
                o = format!("-{o}");
            }
        }
        ops.push(o);
    }
    let dpp = if i.dpp_kind == Dpp::None { "" } else { "_e64_dpp" };
    let mut s = format!("{}{dpp} {}", d.name, ops.join(", "));
    let list = |v: u8| (0..nsrc).map(|k| (v >> k & 1).to_string()).collect::<Vec<_>>().join(",");
    let default_hi = if mix { 0 } else { (1 << nsrc) - 1 };
    if i.opsel != 0 {
        s += &format!(" op_sel:[{}]", list(i.opsel));
    }
    if i.opsel_hi & ((1 << nsrc) - 1) != default_hi {
        s += &format!(" op_sel_hi:[{}]", list(i.opsel_hi));
    }
    if i.neg != 0 && !mix {
        s += &format!(" neg_lo:[{}]", list(i.neg));
    }
    if i.neg_hi != 0 && !mix {
        s += &format!(" neg_hi:[{}]", list(i.neg_hi));
    }
    if i.clamp {
        s += " clamp";
    }
    s + &dpp_suffix(i)
}

fn waitcnt(imm: u16) -> String {
    let (vm, exp, lgkm) = (imm >> 10 & 0x3f, imm & 7, imm >> 4 & 0x3f);
    let mut p = Vec::new();
    if vm != 0x3f {
        p.push(format!("vmcnt({vm})"));
    }
    if exp != 7 {
        p.push(format!("expcnt({exp})"));
    }
    if lgkm != 0x3f {
        p.push(format!("lgkmcnt({lgkm})"));
    }
    if p.is_empty() { format!("{imm:#x}") } else { p.join(" ") }
}

fn hwreg(imm: u16) -> String {
    let (id, off, size) = (imm & 0x3f, imm >> 6 & 0x1f, (imm >> 11) + 1);
    let name = match id {
        1 => "HW_REG_MODE",
        2 => "HW_REG_STATUS",
        3 => "HW_REG_TRAPSTS",
        4 => "HW_REG_HW_ID",
        5 => "HW_REG_GPR_ALLOC",
        6 => "HW_REG_LDS_ALLOC",
        7 => "HW_REG_IB_STS",
        15 => "HW_REG_SH_MEM_BASES",
        18 => "HW_REG_PERF_SNAPSHOT_PC_LO",
        19 => "HW_REG_PERF_SNAPSHOT_PC_HI",
        20 => "HW_REG_FLAT_SCR_LO",
        21 => "HW_REG_FLAT_SCR_HI",
        22 => "HW_REG_XNACK_MASK",
        23 => "HW_REG_HW_ID1",
        24 => "HW_REG_HW_ID2",
        25 => "HW_REG_POPS_PACKER",
        26 => "HW_REG_PERF_SNAPSHOT_DATA",
        29 => "HW_REG_SHADER_CYCLES",
        _ => "",
    };
    let n = if name.is_empty() { id.to_string() } else { name.to_string() };
    if off == 0 && size == 32 { format!("hwreg({n})") } else { format!("hwreg({n}, {off}, {size})") }
}

fn depctr(imm: u16) -> String {
    // (name, shift, width) in LLVM's print order; fields at their maximum are omitted
    let f = [
        ("hold_cnt", 7, 1),
        ("sa_sdst", 0, 1),
        ("va_vdst", 12, 4),
        ("va_sdst", 9, 3),
        ("va_ssrc", 8, 1),
        ("va_vcc", 1, 1),
        ("vm_vsrc", 2, 3),
    ];
    let p: Vec<String> = f
        .iter()
        .filter(|(_, sh, w)| (imm >> sh) & ((1 << w) - 1) != (1 << w) - 1)
        .map(|(n, sh, w)| format!("depctr_{n}({})", (imm >> sh) & ((1 << w) - 1)))
        .collect();
    if p.is_empty() { format!("{imm:#x}") } else { p.join(" ") }
}

fn delay_alu(imm: u16) -> String {
    let id = |v: u16| -> String {
        match v {
            0 => "NO_DEP".into(),
            1..=4 => format!("VALU_DEP_{v}"),
            5..=7 => format!("TRANS32_DEP_{}", v - 4),
            8 => "FMA_ACCUM_CYCLE_1".into(),
            9..=11 => format!("SALU_CYCLE_{}", v - 8),
            _ => format!("{v}"),
        }
    };
    let skip = ["SAME", "NEXT", "SKIP_1", "SKIP_2", "SKIP_3", "SKIP_4"];
    let mut s = format!("instid0({})", id(imm & 0xf));
    let (sk, id1) = (imm >> 4 & 7, imm >> 7 & 0xf);
    if sk != 0 {
        s += &format!(" | instskip({})", skip.get(sk as usize).unwrap_or(&"?"));
    }
    if id1 != 0 {
        s += &format!(" | instid1({})", id(id1));
    }
    s
}

/// Text of one instruction as LLVM prints it.
pub fn text(i: &Inst, _pc: u64) -> String {
    let name = i.name();
    match i.fam {
        Fam::Valu => valu_text(i),
        Fam::Vop3p => vop3p_text(i),
        Fam::Vopd => {
            let nm = |op: u16| {
                valu_desc(op)
                    .map(|d| if d.n32.is_empty() { d.n64 } else { d.n32 })
                    .unwrap_or("?")
                    .trim_end_matches("_e32")
                    .replacen("v_", "v_dual_", 1)
            };
            let part = |op: u16, dst: u16, s0: u16, s1: u16| {
                let n = nm(op);
                let mut s = format!("{n} v{dst}, {}", operand(s0, 1, i.lit, false, false));
                if op == crate::optable::vop::V_FMAMK_F32 {
                    s += &format!(", {:#x}", i.lit);
                }
                if op != crate::optable::vop::V_MOV_B32 {
                    s += &format!(", {}", operand(s1, 1, 0, false, false));
                }
                if op == crate::optable::vop::V_FMAAK_F32 {
                    s += &format!(", {:#x}", i.lit);
                }
                s
            };
            format!("{} :: {}", part(i.op, i.dst, i.src[0], i.src[1]), part(i.op_y, i.dst_y, i.src_y[0], i.src_y[1]))
        }
        Fam::Sop2 => format!(
            "{name} {}, {}, {}",
            sreg(i.dst, i.shape[0] & 0xf),
            operand(i.src[0], i.shape[1], i.lit, false, false),
            operand(i.src[1], i.shape[2], i.lit, false, false)
        ),
        Fam::Sop1 => {
            if name == "s_getpc_b64" {
                return format!("{name} {}", sreg(i.dst, 2));
            }
            if name == "s_setpc_b64" || name == "s_rfe_b64" {
                return format!("{name} {}", operand(i.src[0], 2, i.lit, false, false));
            }
            if name.starts_with("s_sendmsg_rtn") {
                // The source field is the message id, not an operand (LLVM's names).
                const RTN: [&str; 6] = [
                    "MSG_RTN_GET_DOORBELL",
                    "MSG_RTN_GET_DDID",
                    "MSG_RTN_GET_TMA",
                    "MSG_RTN_GET_REALTIME",
                    "MSG_RTN_SAVE_WAVE",
                    "MSG_RTN_GET_TBA",
                ];
                let id = i.src[0] as usize;
                let msg = match id.checked_sub(128).and_then(|j| RTN.get(j)) {
                    Some(m) => format!("sendmsg({m})"),
                    None => format!("sendmsg({id})"),
                };
                return format!("{name} {}, {msg}", sreg(i.dst, i.shape[0] & 0xf));
            }
            format!("{name} {}, {}", sreg(i.dst, i.shape[0] & 0xf), operand(i.src[0], i.shape[1], i.lit, false, false))
        }
        Fam::Sopc => format!(
            "{name} {}, {}",
            operand(i.src[0], i.shape[1], i.lit, false, false),
            operand(i.src[1], i.shape[2], i.lit, false, false)
        ),
        Fam::Sopk => match name {
            "s_version" => format!("{name} {:#x}", i.imm as u16),
            "s_getreg_b32" => format!("{name} {}, {}", sreg(i.dst, 1), hwreg(i.imm as u16)),
            "s_setreg_b32" => format!("{name} {}, {}", hwreg(i.imm as u16), sreg(i.dst, 1)),
            "s_setreg_imm32_b32" => format!("{name} {}, {:#x}", hwreg(i.imm as u16), i.lit),
            "s_call_b64" => format!("{name} {}, {}", sreg(i.dst, 2), i.imm),
            n if n.starts_with("s_waitcnt_") => format!("{name} {}, {:#x}", sreg(i.dst, 1), i.imm as u16),
            _ => format!("{name} {}, {:#x}", sreg(i.dst, 1), i.imm as u16),
        },
        Fam::Sopp => match name {
            "s_endpgm" | "s_barrier" | "s_icache_inv" | "s_wait_idle" | "s_endpgm_saved" | "s_code_end"
            | "s_wakeup" | "s_ttracedata"
                if i.imm == 0 =>
            {
                name.to_string()
            }
            "s_waitcnt" => format!("{name} {}", waitcnt(i.imm as u16)),
            "s_delay_alu" => format!("{name} {}", delay_alu(i.imm as u16)),
            "s_clause" | "s_set_inst_prefetch_distance" | "s_round_mode" | "s_ttracedata_imm" | "s_wait_event" => {
                format!("{name} {:#x}", i.imm as u16)
            }
            "s_sendmsg" if i.imm == 3 => "s_sendmsg sendmsg(MSG_DEALLOC_VGPRS)".into(),
            // (LLVM's trap lowering raises an interrupt before s_trap.)
            "s_sendmsg" if i.imm == 1 => "s_sendmsg sendmsg(MSG_INTERRUPT)".into(),
            "s_waitcnt_depctr" => format!("{name} {}", depctr(i.imm as u16)),
            n if n.starts_with("s_cbranch") || n == "s_branch" => format!("{name} {}", i.imm as u16),
            // other immediates: decimal when an inline-constant-sized value, else hex
            _ => {
                if (i.imm as u16) <= 64 {
                    format!("{name} {}", i.imm as u16)
                } else {
                    format!("{name} {:#x}", i.imm as u16)
                }
            }
        },
        Fam::Smem => {
            if name == "s_gl1_inv" || name == "s_dcache_inv" {
                return name.into();
            }
            let buf = name.starts_with("s_buffer") || name == "s_atc_probe_buffer";
            let base = sreg(i.src[0], if buf { 4 } else { 2 });
            // (a 16-dword shape does not fit the shape byte: read the width off the name)
            let n = if name.ends_with("b512") {
                16
            } else if name.ends_with("b256") {
                8
            } else if name.ends_with("b128") {
                4
            } else if name.ends_with("b64") {
                2
            } else {
                1
            };
            let d = if name.starts_with("s_atc_probe") { format!("{}", i.dst) } else { sreg(i.dst, n) };
            if i.saddr != src::NULL {
                let mut s = format!("{name} {d}, {base}, {}", sreg(i.saddr, 1));
                if i.imm != 0 {
                    s += &format!(" offset:{:#x}", i.imm);
                }
                s
            } else if i.imm == 0 {
                format!("{name} {d}, {base}, null")
            } else {
                format!("{name} {d}, {base}, {:#x}", i.imm)
            }
        }
        Fam::Ds => {
            let mut ops = Vec::new();
            if i.shape[0] != 0 {
                ops.push(operand(src::VGPR0 + i.dst, i.shape[0], 0, false, false));
            }
            for k in 0..3 {
                if i.shape[k + 1] != 0 {
                    ops.push(operand(src::VGPR0 + i.src[k], i.shape[k + 1], 0, false, false));
                }
            }
            let mut s = if ops.is_empty() { name.to_string() } else { format!("{name} {}", ops.join(", ")) };
            if name.contains("2addr") {
                if i.imm & 0xff != 0 {
                    s += &format!(" offset0:{}", i.imm & 0xff);
                }
                if i.imm >> 8 & 0xff != 0 {
                    s += &format!(" offset1:{}", i.imm >> 8 & 0xff);
                }
            } else if name == "ds_swizzle_b32" {
                if i.imm != 0 {
                    s += &format!(" offset:{}", swizzle(i.imm as u16));
                }
            } else if i.imm != 0 {
                s += &format!(" offset:{}", i.imm);
            }
            if i.flags & 8 != 0 {
                s += " gds";
            }
            s
        }
        Fam::Flat | Fam::Global | Fam::Scratch => {
            let store = name.contains("_store") || name.contains("_atomic");
            let mut ops = Vec::new();
            let atomic = name.contains("_atomic");
            if atomic && i.flags & 1 != 0 {
                // returning atomics: the result is as wide as the data (half of it for cmpswap)
                let w = if name.contains("cmpswap") { (i.shape[2] & 0xf) / 2 } else { i.shape[2] & 0xf };
                ops.push(operand(src::VGPR0 + i.dst, w, 0, false, false));
            } else if i.shape[0] != 0 && !atomic {
                ops.push(operand(src::VGPR0 + i.dst, i.shape[0], 0, false, false));
            }
            let off = i.saddr == src::NULL || i.saddr == 0x7c;
            let addtid = name.contains("addtid");
            let addr = match i.fam {
                _ if addtid => String::new(),
                Fam::Flat => operand(src::VGPR0 + i.src[0], 2, 0, false, false),
                Fam::Global => operand(src::VGPR0 + i.src[0], if off { 2 } else { 1 }, 0, false, false),
                _ => {
                    if i.flags & 8 != 0 {
                        operand(src::VGPR0 + i.src[0], 1, 0, false, false)
                    } else {
                        "off".into()
                    }
                }
            };
            if !addtid {
                ops.push(addr);
            }
            if store {
                ops.push(operand(src::VGPR0 + i.src[1], i.shape[2], 0, false, false));
            }
            if i.fam != Fam::Flat {
                ops.push(if off { "off".into() } else { sreg(i.saddr, if i.fam == Fam::Global { 2 } else { 1 }) });
            }
            let mut s = format!("{name} {}", ops.join(", "));
            if i.imm != 0 {
                s += &format!(" offset:{}", i.imm);
            }
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
        Fam::Invalid => "invalid".into(),
        Fam::Cache => name.into(),
        Fam::Mubuf | Fam::Mtbuf | Fam::Mimg | Fam::Exp | Fam::Vinterp | Fam::Ldsdir => {
            resource::text(i).unwrap_or_default()
        }
    }
}

fn swizzle(off: u16) -> String {
    if off & 0x8000 != 0 {
        return format!("swizzle(QUAD_PERM,{},{},{},{})", off & 3, off >> 2 & 3, off >> 4 & 3, off >> 6 & 3);
    }
    let (and, or, xor) = (off & 0x1f, off >> 5 & 0x1f, off >> 10 & 0x1f);
    // the same pattern recognition as LLVM's printer
    if and == 0x1f && or == 0 && xor.count_ones() == 1 {
        return format!("swizzle(SWAP,{xor})");
    }
    if and == 0x1f && or == 0 && xor > 0 && (xor + 1).is_power_of_two() {
        return format!("swizzle(REVERSE,{})", xor + 1);
    }
    let group = 1 + (!and & 0x1f);
    if group > 1 && group.is_power_of_two() && or < group && xor == 0 {
        return format!("swizzle(BROADCAST,{group},{or})");
    }
    format!(
        "swizzle(BITMASK_PERM,\"{}\")",
        (0..5)
            .rev()
            .map(|b| {
                if and >> b & 1 == 0 {
                    if or >> b & 1 != 0 { '1' } else { '0' }
                } else if xor >> b & 1 != 0 {
                    'i'
                } else {
                    'p'
                }
            })
            .collect::<String>()
    )
}

/// Disassemble every function of `.text` (decoded from its symbols), one instruction per line,
/// in the form `<name>:` then tab-indented instruction text, like `llvm-objdump-22 -d`.
pub fn disassemble(code_object: &[u8]) -> Result<String, EmuError> {
    let co = crate::loader::load(code_object)?;
    let mut out = String::from("\n<code object>:\tfile format elf64-amdgpu\n\nDisassembly of section .text:\n");
    // (name, start, symbol size or 0)
    let mut funcs: Vec<(String, u64, u64)> =
        co.functions.iter().zip(&co.function_sizes).map(|((n, a), s)| (n.clone(), *a, *s)).collect();
    if funcs.is_empty() {
        funcs = co.text.iter().map(|t| (".text".to_string(), t.0, 0)).collect();
    }
    funcs.sort_by_key(|f| f.1);
    for (fi, (name, start, size)) in funcs.iter().enumerate() {
        let end = funcs
            .get(fi + 1)
            .map(|f| f.1)
            .unwrap_or_else(|| co.text.iter().find(|t| *start >= t.0 && *start < t.1).map(|t| t.1).unwrap_or(*start));
        // Within the symbol's extent (all of the range when the symbol has no size) every word
        // must be an instruction; past it (padding up to the next symbol, which ld.lld fills
        // with s_code_end, or data) bytes are listed the way objdump lists them, with
        // `<unknown>` for words that are no instruction: they are not code of any function.
        let sym_end = if *size == 0 { end } else { start.saturating_add(*size).min(end) }; // st_size is from the file
        let _ = writeln!(out, "\n{start:016x} <{name}>:");
        let mut pc = *start;
        while pc < end {
            // An instruction is at most 16 bytes: decode from that window, not from the rest of
            // the function (which made a long function quadratic to disassemble).
            let window = &co.image[pc as usize..end.min(pc + 16) as usize];
            let words: Vec<u32> = window
                .chunks(4)
                .map(|c| {
                    let mut b = [0u8; 4];
                    b[..c.len()].copy_from_slice(c);
                    u32::from_le_bytes(b)
                })
                .collect();
            // objdump skips runs of at least 8 zero bytes (in multiples of 4)
            let zeros = co.image[pc as usize..end as usize].iter().take_while(|&&b| b == 0).count();
            if zeros >= 8 {
                let _ = writeln!(out, "\t\t...");
                pc += (zeros & !3) as u64;
                continue;
            }
            match decode::decode(&words) {
                Ok(i) => {
                    // objdump's layout: text padded to 59 columns, then address and words
                    let hex: Vec<String> =
                        words[..(i.len as usize / 4).min(words.len())].iter().map(|w| format!("{w:08X}")).collect();
                    let mut line = format!("\t{:<59}// {pc:012X}: {}", text(&i, pc), hex.join(" "));
                    if i.fam == Fam::Sopp && (i.name().starts_with("s_cbranch") || i.name() == "s_branch") {
                        let target = (pc as i64 + 4 + 4 * i.imm as i64) as u64;
                        let _ = write!(line, " <{name}+{:#x}>", target.wrapping_sub(*start));
                    }
                    let _ = writeln!(out, "{line}");
                    pc += i.len as u64;
                }
                // a lone zero word is gfx11's v_illegal encoding (LLVM names it; it never executes)
                Err(_) if words[0] == 0 => {
                    let _ = writeln!(out, "\t{:<59}// {pc:012X}: {:08X}", "v_illegal", words[0]);
                    pc += 4;
                }
                Err(_) if pc >= sym_end => {
                    let _ = writeln!(out, "\t{:<59}// {pc:012X}: {:08X}", "<unknown>", words[0]);
                    pc += 4;
                }
                // a word that is no gfx11 instruction: listed as data, one word, as objdump does
                // (execution refuses it by its words)
                Err(_) => {
                    let _ =
                        writeln!(out, "\t{:<59}// {pc:012X}: {:08X}", format!(".long {:#010x}", words[0]), words[0]);
                    pc += 4;
                }
            }
        }
    }
    Ok(out)
}
