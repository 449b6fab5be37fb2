//! WMMA 16x16x16 (wave32). Fragment layout (rdna3-facts.md): A[i][k] sits in lanes i and
//! i+16, element k in VGPR k/2 half k%2 (16-bit) or VGPR k/4 byte k%4 (iu8) or VGPR k/8
//! nibble k%8 (iu4); B[k][j] likewise by column j in lane j (and j+16). C/D[i][j] (32-bit)
//! is in VGPR i/2 of lane (16*i)%32 + j; 16-bit C/D use the low half (op_sel = 0) or the
//! high half (op_sel[2] = 1) of that VGPR.
use super::{Ctx, Wave};
use crate::decode::{Inst, src};
use crate::error::EmuError;
use crate::float::*;
use crate::optable::vop3pop as o;

fn reg(i: &Inst, k: usize) -> usize {
    (i.src[k] - src::VGPR0) as usize
}

pub fn exec(_ctx: &Ctx, w: &mut Wave, i: &Inst, _pc: u64) -> Result<(), EmuError> {
    let op = i.op;
    let (a0, b0, c0, d0) = (reg(i, 0), reg(i, 1), reg(i, 2), i.dst as usize);
    // element k of the A row held by lane `lane` (lanes 0-15 are authoritative)
    let elem = |base: usize, lane: usize, k: usize| -> f64 {
        match op {
            o::V_WMMA_I32_16X16X16_IU8 => {
                let b = (w.v[base + k / 4][lane] >> (8 * (k % 4))) & 0xff;
                let signed = if base == a0 { i.neg & 1 != 0 } else { i.neg & 2 != 0 };
                if signed { b as u8 as i8 as f64 } else { b as f64 }
            }
            o::V_WMMA_I32_16X16X16_IU4 => {
                let n = (w.v[base + k / 8][lane] >> (4 * (k % 8))) & 0xf;
                let signed = if base == a0 { i.neg & 1 != 0 } else { i.neg & 2 != 0 };
                if signed && n >= 8 { n as f64 - 16.0 } else { n as f64 }
            }
            _ => {
                let h = (w.v[base + k / 2][lane] >> (16 * (k % 2))) as u16;
                if matches!(op, o::V_WMMA_F32_16X16X16_BF16 | o::V_WMMA_BF16_16X16X16_BF16) {
                    bf16_to_f32(h) as f64
                } else {
                    f16_to_f32(h) as f64
                }
            }
        }
    };
    let hi16 = i.opsel & 4 != 0;
    let mut d = [[0u32; 32]; 8];
    for row in 0..16 {
        for col in 0..16 {
            let lane = (16 * row) % 32 + col;
            let v = row / 2;
            let cbits = w.v[c0 + v][lane];
            match op {
                o::V_WMMA_I32_16X16X16_IU8 | o::V_WMMA_I32_16X16X16_IU4 => {
                    let mut acc = cbits as i32 as i64;
                    for k in 0..16 {
                        acc += (elem(a0, row, k) * elem(b0, col, k)) as i64;
                    }
                    d[v][lane] =
                        if i.clamp { acc.clamp(i32::MIN as i64, i32::MAX as i64) as i32 as u32 } else { acc as u32 };
                }
                o::V_WMMA_F32_16X16X16_F16 | o::V_WMMA_F32_16X16X16_BF16 => {
                    let mut acc = f32::from_bits(cbits);
                    for k in 0..16 {
                        acc += (elem(a0, row, k) * elem(b0, col, k)) as f32;
                    }
                    d[v][lane] = acc.to_bits();
                }
                _ => {
                    let bf = op == o::V_WMMA_BF16_16X16X16_BF16;
                    let ch = if hi16 { (cbits >> 16) as u16 } else { cbits as u16 };
                    let mut acc = if bf { bf16_to_f32(ch) } else { f16_to_f32(ch) };
                    for k in 0..16 {
                        acc += (elem(a0, row, k) * elem(b0, col, k)) as f32;
                    }
                    let r = if bf { f32_to_bf16(acc) } else { f32_to_f16(acc) } as u32;
                    d[v][lane] = if hi16 { (cbits & 0xffff) | r << 16 } else { (cbits & 0xffff_0000) | r };
                }
            }
        }
    }
    w.v[d0..d0 + 8].copy_from_slice(&d);
    Ok(())
}
