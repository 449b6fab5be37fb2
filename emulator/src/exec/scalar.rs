//! Scalar ALU (SOP1/SOP2/SOPK/SOPC), program control (SOPP) and scalar memory (SMEM).
use super::{Ctx, Stop, Wave, unsupported};
use crate::decode::{Fam, Inst, src};
use crate::error::EmuError;
use crate::memory::View;
use crate::optable::{smemop as m, sop1op as s1, sop2op as s2, sopcop as sc, sopkop as sk, soppop as sp};

#[inline]
fn bfe64(v: u64, off: u32, width: u32) -> u64 {
    if width == 0 {
        return 0;
    }
    let x = v >> (off & 63);
    if width >= 64 { x } else { x & ((1u64 << width) - 1) }
}

pub fn salu(ctx: &Ctx, w: &mut Wave, i: &Inst, pc: u64) -> Result<(), EmuError> {
    let a = w.sval(i.src[0], i.lit);
    let b = w.sval(i.src[1], i.lit);
    let a64 = || w.sval64(i.src[0], i.lit, false);
    let b64 = || w.sval64(i.src[1], i.lit, false);
    match i.fam {
        Fam::Sop2 => {
            let d = i.dst;
            match i.op {
                s2::S_ADD_U32 => {
                    let (r, c) = a.overflowing_add(b);
                    w.swrite(d, r);
                    w.scc = c;
                }
                s2::S_SUB_U32 => {
                    let (r, c) = a.overflowing_sub(b);
                    w.swrite(d, r);
                    w.scc = c;
                }
                s2::S_ADD_I32 => {
                    let (r, o) = (a as i32).overflowing_add(b as i32);
                    w.swrite(d, r as u32);
                    w.scc = o;
                }
                s2::S_SUB_I32 => {
                    let (r, o) = (a as i32).overflowing_sub(b as i32);
                    w.swrite(d, r as u32);
                    w.scc = o;
                }
                s2::S_ADDC_U32 => {
                    let r = a as u64 + b as u64 + w.scc as u64;
                    w.swrite(d, r as u32);
                    w.scc = r >> 32 != 0;
                }
                s2::S_SUBB_U32 => {
                    let r = (a as u64).wrapping_sub(b as u64).wrapping_sub(w.scc as u64);
                    w.swrite(d, r as u32);
                    w.scc = (b as u64 + w.scc as u64) > a as u64;
                }
                s2::S_ABSDIFF_I32 => {
                    let r = (a as i32).wrapping_sub(b as i32).wrapping_abs() as u32;
                    w.swrite(d, r);
                    w.scc = r != 0;
                }
                s2::S_LSHL_B32 => {
                    let r = a << (b & 31);
                    w.swrite(d, r);
                    w.scc = r != 0;
                }
                s2::S_LSHR_B32 => {
                    let r = a >> (b & 31);
                    w.swrite(d, r);
                    w.scc = r != 0;
                }
                s2::S_ASHR_I32 => {
                    let r = ((a as i32) >> (b & 31)) as u32;
                    w.swrite(d, r);
                    w.scc = r != 0;
                }
                s2::S_LSHL_B64 => {
                    let r = a64() << (b & 63);
                    w.swrite64(d, r);
                    w.scc = r != 0;
                }
                s2::S_LSHR_B64 => {
                    let r = a64() >> (b & 63);
                    w.swrite64(d, r);
                    w.scc = r != 0;
                }
                s2::S_ASHR_I64 => {
                    let r = ((a64() as i64) >> (b & 63)) as u64;
                    w.swrite64(d, r);
                    w.scc = r != 0;
                }
                s2::S_LSHL1_ADD_U32 | s2::S_LSHL2_ADD_U32 | s2::S_LSHL3_ADD_U32 | s2::S_LSHL4_ADD_U32 => {
                    let sh = (i.op - s2::S_LSHL1_ADD_U32 + 1) as u32;
                    let r = ((a as u64) << sh) + b as u64;
                    w.swrite(d, r as u32);
                    w.scc = r >> 32 != 0;
                }
                s2::S_MIN_I32 => {
                    w.scc = (a as i32) < (b as i32);
                    w.swrite(d, if w.scc { a } else { b });
                }
                s2::S_MIN_U32 => {
                    w.scc = a < b;
                    w.swrite(d, if w.scc { a } else { b });
                }
                s2::S_MAX_I32 => {
                    w.scc = (a as i32) > (b as i32);
                    w.swrite(d, if w.scc { a } else { b });
                }
                s2::S_MAX_U32 => {
                    w.scc = a > b;
                    w.swrite(d, if w.scc { a } else { b });
                }
                s2::S_AND_B32
                | s2::S_OR_B32
                | s2::S_XOR_B32
                | s2::S_NAND_B32
                | s2::S_NOR_B32
                | s2::S_XNOR_B32
                | s2::S_AND_NOT1_B32
                | s2::S_OR_NOT1_B32 => {
                    let r = logic(i.op - s2::S_AND_B32, a as u64, b as u64) as u32;
                    w.swrite(d, r);
                    w.scc = r != 0;
                }
                s2::S_AND_B64
                | s2::S_OR_B64
                | s2::S_XOR_B64
                | s2::S_NAND_B64
                | s2::S_NOR_B64
                | s2::S_XNOR_B64
                | s2::S_AND_NOT1_B64
                | s2::S_OR_NOT1_B64 => {
                    let r = logic(i.op - s2::S_AND_B64, a64(), b64());
                    w.swrite64(d, r);
                    w.scc = r != 0;
                }
                s2::S_BFE_U32 => {
                    let r = bfe64(a as u64, b & 31, (b >> 16) & 0x7f).min(u32::MAX as u64) as u32;
                    w.swrite(d, r);
                    w.scc = r != 0;
                }
                s2::S_BFE_I32 => {
                    let (off, wd) = (b & 31, ((b >> 16) & 0x7f).min(32));
                    let r = if wd == 0 { 0 } else { (((a >> off) << (32 - wd)) as i32 >> (32 - wd)) as u32 };
                    w.swrite(d, r);
                    w.scc = r != 0;
                }
                s2::S_BFE_U64 => {
                    let r = bfe64(a64(), b & 63, (b >> 16) & 0x7f);
                    w.swrite64(d, r);
                    w.scc = r != 0;
                }
                s2::S_BFE_I64 => {
                    let (off, wd) = (b & 63, ((b >> 16) & 0x7f).min(64));
                    let r = if wd == 0 { 0 } else { (((a64() >> off) << (64 - wd)) as i64 >> (64 - wd)) as u64 };
                    w.swrite64(d, r);
                    w.scc = r != 0;
                }
                s2::S_BFM_B32 => w.swrite(d, (((1u64 << (a & 31)) - 1) as u32) << (b & 31)),
                s2::S_BFM_B64 => w.swrite64(d, ((1u64 << (a & 63)).wrapping_sub(1)) << (b & 63)),
                s2::S_MUL_I32 => w.swrite(d, a.wrapping_mul(b)),
                s2::S_MUL_HI_U32 => w.swrite(d, ((a as u64 * b as u64) >> 32) as u32),
                s2::S_MUL_HI_I32 => w.swrite(d, ((a as i32 as i64 * b as i32 as i64) >> 32) as u32),
                s2::S_CSELECT_B32 => w.swrite(d, if w.scc { a } else { b }),
                s2::S_CSELECT_B64 => {
                    let r = if w.scc { a64() } else { b64() };
                    w.swrite64(d, r)
                }
                s2::S_PACK_LL_B32_B16 => w.swrite(d, (a & 0xffff) | b << 16),
                s2::S_PACK_LH_B32_B16 => w.swrite(d, (a & 0xffff) | (b & 0xffff_0000)),
                s2::S_PACK_HH_B32_B16 => w.swrite(d, a >> 16 | (b & 0xffff_0000)),
                s2::S_PACK_HL_B32_B16 => w.swrite(d, a >> 16 | b << 16),
                _ => return Err(unsupported(ctx, pc, i, "SOP2 opcode not implemented")),
            }
        }
        Fam::Sopk => {
            let d = i.dst;
            let k = i.imm;
            let cur = w.sval(d, 0);
            match i.op {
                sk::S_MOVK_I32 => w.swrite(d, k as u32),
                sk::S_CMOVK_I32 => {
                    if w.scc {
                        w.swrite(d, k as u32)
                    }
                }
                sk::S_CMPK_EQ_I32..=sk::S_CMPK_LE_I32 => w.scc = cmp_i(i.op - sk::S_CMPK_EQ_I32, cur as i32, k),
                sk::S_CMPK_EQ_U32..=sk::S_CMPK_LE_U32 => w.scc = cmp_u(i.op - sk::S_CMPK_EQ_U32, cur, k as u16 as u32),
                sk::S_ADDK_I32 => {
                    let (r, o) = (cur as i32).overflowing_add(k);
                    w.swrite(d, r as u32);
                    w.scc = o;
                }
                sk::S_MULK_I32 => w.swrite(d, (cur as i32).wrapping_mul(k) as u32),
                sk::S_GETREG_B32 => w.swrite(d, 0),
                sk::S_SETREG_B32
                | sk::S_VERSION
                | sk::S_WAITCNT_VSCNT
                | sk::S_WAITCNT_VMCNT
                | sk::S_WAITCNT_EXPCNT
                | sk::S_WAITCNT_LGKMCNT
                | 0x13 => {}
                sk::S_CALL_B64 => {
                    w.swrite64(d, w.pc);
                    w.pc = (w.pc as i64 + 4 * k as i64) as u64;
                }
                _ => return Err(unsupported(ctx, pc, i, "SOPK opcode not implemented")),
            }
        }
        Fam::Sop1 => sop1(ctx, w, i, pc, a)?,
        Fam::Sopc => {
            w.scc = match i.op {
                sc::S_CMP_EQ_I32..=sc::S_CMP_LE_I32 => cmp_i(i.op - sc::S_CMP_EQ_I32, a as i32, b as i32),
                sc::S_CMP_EQ_U32..=sc::S_CMP_LE_U32 => cmp_u(i.op - sc::S_CMP_EQ_U32, a, b),
                sc::S_BITCMP0_B32 => a >> (b & 31) & 1 == 0,
                sc::S_BITCMP1_B32 => a >> (b & 31) & 1 == 1,
                sc::S_BITCMP0_B64 => a64() >> (b & 63) & 1 == 0,
                sc::S_BITCMP1_B64 => a64() >> (b & 63) & 1 == 1,
                sc::S_CMP_EQ_U64 => a64() == b64(),
                sc::S_CMP_LG_U64 => a64() != b64(),
                _ => return Err(unsupported(ctx, pc, i, "SOPC opcode not implemented")),
            };
        }
        _ => unreachable!(),
    }
    Ok(())
}

/// and, or, xor, nand, nor, xnor, and_not1, or_not1 (consecutive opcodes, b32/b64 interleaved).
fn logic(k: u16, a: u64, b: u64) -> u64 {
    match k / 2 {
        0 => a & b,
        1 => a | b,
        2 => a ^ b,
        3 => !(a & b),
        4 => !(a | b),
        5 => !(a ^ b),
        6 => a & !b,
        _ => a | !b,
    }
}
fn cmp_i(k: u16, a: i32, b: i32) -> bool {
    [a == b, a != b, a > b, a >= b, a < b, a <= b][k as usize]
}
fn cmp_u(k: u16, a: u32, b: u32) -> bool {
    [a == b, a != b, a > b, a >= b, a < b, a <= b][k as usize]
}

fn sop1(ctx: &Ctx, w: &mut Wave, i: &Inst, pc: u64, a: u32) -> Result<(), EmuError> {
    let d = i.dst;
    let a64 = w.sval64(i.src[0], i.lit, false);
    match i.op {
        s1::S_MOV_B32 => w.swrite(d, a),
        s1::S_MOV_B64 => w.swrite64(d, a64),
        s1::S_CMOV_B32 => {
            if w.scc {
                w.swrite(d, a)
            }
        }
        s1::S_CMOV_B64 => {
            if w.scc {
                w.swrite64(d, a64)
            }
        }
        s1::S_BREV_B32 => w.swrite(d, a.reverse_bits()),
        s1::S_BREV_B64 => w.swrite64(d, a64.reverse_bits()),
        s1::S_CTZ_I32_B32 => w.swrite(d, if a == 0 { u32::MAX } else { a.trailing_zeros() }),
        s1::S_CTZ_I32_B64 => w.swrite(d, if a64 == 0 { u32::MAX } else { a64.trailing_zeros() }),
        s1::S_CLZ_I32_U32 => w.swrite(d, if a == 0 { u32::MAX } else { a.leading_zeros() }),
        s1::S_CLZ_I32_U64 => w.swrite(d, if a64 == 0 { u32::MAX } else { a64.leading_zeros() }),
        s1::S_CLS_I32 => {
            let x = if (a as i32) < 0 { !a } else { a };
            w.swrite(d, if x == 0 { u32::MAX } else { x.leading_zeros() - 1 })
        }
        s1::S_SEXT_I32_I8 => w.swrite(d, a as i8 as i32 as u32),
        s1::S_SEXT_I32_I16 => w.swrite(d, a as i16 as i32 as u32),
        s1::S_BITSET0_B32 => {
            let c = w.sval(d, 0) & !(1 << (a & 31));
            w.swrite(d, c)
        }
        s1::S_BITSET1_B32 => {
            let c = w.sval(d, 0) | (1 << (a & 31));
            w.swrite(d, c)
        }
        s1::S_BITSET0_B64 => {
            let c = w.sval64(d, 0, false) & !(1u64 << (a & 63));
            w.swrite64(d, c)
        }
        s1::S_BITSET1_B64 => {
            let c = w.sval64(d, 0, false) | (1u64 << (a & 63));
            w.swrite64(d, c)
        }
        s1::S_ABS_I32 => {
            let r = (a as i32).wrapping_abs() as u32;
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_BCNT0_I32_B32 => {
            let r = a.count_zeros();
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_BCNT0_I32_B64 => {
            let r = a64.count_zeros();
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_BCNT1_I32_B32 => {
            let r = a.count_ones();
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_BCNT1_I32_B64 => {
            let r = a64.count_ones();
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_NOT_B32 => {
            let r = !a;
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_NOT_B64 => {
            let r = !a64;
            w.swrite64(d, r);
            w.scc = r != 0;
        }
        s1::S_WQM_B32 => {
            let mut r = 0;
            for q in 0..8 {
                if a >> (4 * q) & 0xf != 0 {
                    r |= 0xf << (4 * q);
                }
            }
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_AND_SAVEEXEC_B32..=s1::S_AND_NOT1_WREXEC_B64 => {
            let k = i.op - s1::S_AND_SAVEEXEC_B32;
            if k % 2 == 1 {
                return Err(unsupported(ctx, pc, i, "64-bit EXEC ops need wave64"));
            }
            let e = w.exec();
            let r = match k / 2 {
                0 => a & e,
                1 => a | e,
                2 => a ^ e,
                3 => !(a & e),
                4 => !(a | e),
                5 => !(a ^ e),
                6 => !a & e,
                7 => !a | e,
                8 => a & !e,
                9 => a | !e,
                10 => !a & e,
                11 => a & !e, // wrexec: the result goes to EXEC and SDST
                _ => unreachable!(),
            };
            if k / 2 >= 10 {
                w.s[src::EXEC_LO as usize] = r;
                w.swrite(d, r);
            } else {
                w.swrite(d, e);
                w.s[src::EXEC_LO as usize] = r;
            }
            w.scc = r != 0;
        }
        s1::S_CLS_I32_I64 => {
            let x = if (a64 as i64) < 0 { !a64 } else { a64 };
            w.swrite(d, if x == 0 { u32::MAX } else { x.leading_zeros() - 1 })
        }
        s1::S_QUADMASK_B32 => {
            let r = (0..8).fold(0u32, |m, q| m | (((a >> (4 * q)) & 0xf != 0) as u32) << q);
            w.swrite(d, r);
            w.scc = r != 0;
        }
        s1::S_QUADMASK_B64 => {
            let r = (0..16).fold(0u64, |m, q| m | (((a64 >> (4 * q)) & 0xf != 0) as u64) << q);
            w.swrite64(d, r);
            w.scc = r != 0;
        }
        s1::S_WQM_B64 => {
            let r = (0..16).fold(0u64, |m, q| m | if (a64 >> (4 * q)) & 0xf != 0 { 0xf << (4 * q) } else { 0 });
            w.swrite64(d, r);
            w.scc = r != 0;
        }
        s1::S_BITREPLICATE_B64_B32 => {
            let r = (0..32).fold(0u64, |m, b| m | (((a >> b) & 1) as u64 * 3) << (2 * b));
            w.swrite64(d, r)
        }
        s1::S_MOVRELS_B32 => {
            let m0 = w.s[125];
            let v = w.sval(i.src[0].wrapping_add(m0 as u16) & 127, 0);
            w.swrite(d, v)
        }
        s1::S_MOVRELS_B64 => {
            let m0 = w.s[125];
            let v = w.sval64(i.src[0].wrapping_add(m0 as u16) & 127, 0, false);
            w.swrite64(d, v)
        }
        s1::S_MOVRELD_B32 => {
            let m0 = w.s[125];
            w.swrite(d.wrapping_add(m0 as u16) & 127, a)
        }
        s1::S_MOVRELD_B64 => {
            let m0 = w.s[125];
            w.swrite64(d.wrapping_add(m0 as u16) & 127, a64)
        }
        s1::S_GETPC_B64 => w.swrite64(d, w.pc),
        s1::S_SETPC_B64 => w.pc = a64,
        s1::S_SWAPPC_B64 => {
            w.swrite64(d, w.pc);
            w.pc = a64;
        }
        s1::S_SENDMSG_RTN_B32 => w.swrite(d, 0),
        _ => return Err(unsupported(ctx, pc, i, "SOP1 opcode not implemented")),
    }
    Ok(())
}

/// Program control. Returns `Some(stop)` when the wave ends or waits at a barrier.
pub fn sopp(ctx: &Ctx, w: &mut Wave, i: &Inst, pc: u64) -> Result<Option<Stop>, EmuError> {
    let target = (pc as i64 + 4 + 4 * i.imm as i64) as u64;
    let taken = match i.op {
        sp::S_ENDPGM | sp::S_ENDPGM_SAVED | sp::S_ENDPGM_ORDERED_PS_DONE => {
            w.done = true;
            return Ok(Some(Stop::End));
        }
        sp::S_BARRIER => {
            w.at_barrier = true;
            return Ok(Some(Stop::Barrier));
        }
        sp::S_TRAP => return Err(EmuError::Trap { kernel: ctx.kernel.into(), pc, code: i.imm as u16 & 0xff }),
        sp::S_SETHALT => return Err(EmuError::Trap { kernel: ctx.kernel.into(), pc, code: 0xffff }),
        sp::S_BRANCH => true,
        sp::S_CBRANCH_SCC0 => !w.scc,
        sp::S_CBRANCH_SCC1 => w.scc,
        sp::S_CBRANCH_VCCZ => w.vcc() == 0,
        sp::S_CBRANCH_VCCNZ => w.vcc() != 0,
        sp::S_CBRANCH_EXECZ => w.exec() == 0,
        sp::S_CBRANCH_EXECNZ => w.exec() != 0,
        sp::S_NOP
        | sp::S_SETKILL
        | sp::S_SLEEP
        | sp::S_SET_INST_PREFETCH_DISTANCE
        | sp::S_CLAUSE
        | sp::S_DELAY_ALU
        | sp::S_WAITCNT_DEPCTR
        | sp::S_WAITCNT
        | sp::S_WAIT_IDLE
        | sp::S_WAIT_EVENT
        | sp::S_ROUND_MODE
        | sp::S_CODE_END
        | sp::S_SETPRIO
        | sp::S_SENDMSG
        | sp::S_SENDMSGHALT
        | sp::S_INCPERFLEVEL
        | sp::S_DECPERFLEVEL
        | sp::S_TTRACEDATA
        | sp::S_TTRACEDATA_IMM
        | sp::S_ICACHE_INV
        | sp::S_WAKEUP => false,
        sp::S_DENORM_MODE => {
            // bits 1:0 f32 mode, 3:2 f16/f64 mode (3 = keep denormals)
            w.f32_denorm = i.imm & 3 == 3;
            w.f16_denorm = (i.imm >> 2) & 3 == 3;
            false
        }
        _ => return Err(unsupported(ctx, pc, i, "SOPP opcode not implemented")),
    };
    if taken {
        if target == pc {
            return Err(EmuError::PanicLoop { kernel: ctx.kernel.into(), pc });
        }
        w.pc = target;
    }
    Ok(None)
}

pub fn smem<H: super::race::Hooks>(
    ctx: &Ctx,
    w: &mut Wave,
    i: &Inst,
    pc: u64,
    view: &mut View,
    c: &mut super::Counters,
    h: &mut H,
) -> Result<(), EmuError> {
    let n = match i.op {
        m::S_LOAD_B32 | m::S_BUFFER_LOAD_B32 => 1,
        m::S_LOAD_B64 | m::S_BUFFER_LOAD_B64 => 2,
        m::S_LOAD_B128 | m::S_BUFFER_LOAD_B128 => 4,
        m::S_LOAD_B256 | m::S_BUFFER_LOAD_B256 => 8,
        m::S_LOAD_B512 | m::S_BUFFER_LOAD_B512 => 16,
        m::S_GL1_INV | m::S_DCACHE_INV | m::S_ATC_PROBE | m::S_ATC_PROBE_BUFFER => return Ok(()),
        _ => return Err(unsupported(ctx, pc, i, "SMEM opcode not implemented")),
    };
    let base = w.sval64(i.src[0], 0, false);
    let base = if i.op >= m::S_BUFFER_LOAD_B32 { base & 0xffff_ffff_ffff } else { base };
    let soff = if i.saddr == src::NULL { 0 } else { w.sval(i.saddr, 0) as u64 };
    // SMEM addresses are dword aligned: the low two bits are ignored.
    let addr = base.wrapping_add(i.imm as i64 as u64).wrapping_add(soff) & !3;
    let bytes = 4 * n as u64;
    let r = view.find(addr, bytes).ok_or_else(|| EmuError::MemoryFault {
        kernel: ctx.kernel.into(),
        pc,
        inst: crate::disasm::text(i, pc),
        lane: 0,
        addr,
        bytes: bytes as u32,
        what: "scalar load from",
    })?;
    if H::RACE {
        h.access(ctx, super::race::Space::Global, addr, bytes as usize, super::race::Kind::Read, pc, 0)?;
    }
    let mut buf = [0u8; 64];
    r.read(addr, &mut buf[..bytes as usize]);
    c.global_read += bytes;
    for k in 0..n {
        w.swrite(i.dst + k as u16, u32::from_le_bytes(buf[4 * k..4 * k + 4].try_into().unwrap()));
    }
    Ok(())
}
