//! Cross-lane data movement: DPP16 / DPP8 source swizzles and v_permlane16/x16.
//! All functions read a complete snapshot of the source row before anything is written.
use super::Wave;
use crate::decode::{Dpp, Inst};

/// Source lane of DPP16 control `ctrl` for destination lane `l`, or None if out of the row.
#[inline]
fn dpp16_src(ctrl: u32, l: usize) -> Option<usize> {
    let row = l & !15;
    let li = (l & 15) as i32;
    let s = match ctrl {
        0x00..=0xff => return Some((l & !3) | ((ctrl as usize >> (2 * (l & 3))) & 3)),
        0x101..=0x10f => li + (ctrl & 15) as i32,
        0x111..=0x11f => li - (ctrl & 15) as i32,
        0x121..=0x12f => (li - (ctrl & 15) as i32) & 15,
        0x140 => 15 - li,
        0x141 => (li & 8) | (7 - (li & 7)),
        0x150..=0x15f => (ctrl & 15) as i32,
        0x160..=0x16f => li ^ (ctrl & 15) as i32,
        _ => return None,
    };
    if (0..16).contains(&s) { Some(row | s as usize) } else { None }
}

/// Apply the DPP swizzle of `i` to the VGPR row `src`. Returns the swizzled row and the mask
/// of lanes that may be written (row/bank masks, invalid sources without bound_ctrl).
pub fn fetch(w: &Wave, i: &Inst, src: &[u32; 32]) -> ([u32; 32], u32) {
    let exec = w.exec();
    let mut out = [0u32; 32];
    let mut mask = u32::MAX;
    match i.dpp_kind {
        Dpp::Dpp16 => {
            let ctrl = i.dpp >> 8 & 0x1ff;
            let fi = i.dpp >> 18 & 1 != 0;
            let bound_ctrl = i.dpp >> 19 & 1 != 0;
            let bank_mask = i.dpp >> 24 & 0xf;
            let row_mask = i.dpp >> 28 & 0xf;
            for l in 0..32 {
                let li = l & 15;
                if row_mask >> (l / 16) & 1 == 0 || bank_mask >> (li / 4) & 1 == 0 {
                    mask &= !(1 << l);
                    continue;
                }
                match dpp16_src(ctrl, l) {
                    Some(s) if fi || exec >> s & 1 != 0 => out[l] = src[s],
                    _ => {
                        if bound_ctrl {
                            out[l] = 0
                        } else {
                            mask &= !(1 << l)
                        }
                    }
                }
            }
        }
        Dpp::Dpp8 | Dpp::Dpp8Fi => {
            let fi = i.dpp_kind == Dpp::Dpp8Fi;
            for l in 0..32 {
                let s = (l & !7) | ((i.dpp as usize >> (3 * (l & 7))) & 7);
                out[l] = if fi || exec >> s & 1 != 0 { src[s] } else { 0 };
            }
        }
        Dpp::None => return (*src, mask),
    }
    (out, mask)
}

/// v_permlane16_b32 / v_permlanex16_b32: lane selects from the 64-bit value s2:s1 (4 bits per
/// lane of a row). `cross` reads the other row. op_sel[0] = fetch inactive, op_sel[1] = bound_ctrl.
pub fn permlane(w: &Wave, i: &Inst, src: &[u32; 32], old: &[u32; 32], s1: u32, s2: u32, cross: bool) -> [u32; 32] {
    let exec = w.exec();
    let fi = i.opsel & 1 != 0;
    let bc = i.opsel & 2 != 0;
    let sel = (s2 as u64) << 32 | s1 as u64;
    let mut out = *old;
    for l in 0..32 {
        let li = l & 15;
        let row = if cross { (l & 16) ^ 16 } else { l & 16 };
        let s = row | ((sel >> (4 * li)) & 15) as usize;
        if fi || exec >> s & 1 != 0 {
            out[l] = src[s];
        } else if bc {
            out[l] = 0;
        }
    }
    out
}
