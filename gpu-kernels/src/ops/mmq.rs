//! MMQ (prefill): quantized weights x Q8_1 activation columns on int8 WMMA tiles
//! (`v_wmma_i32_16x16x16_iu8`). One wave = one 16-token x 16-row output tile, C = X · Wᵀ:
//! A = 16 activation columns (lane l: token l % 16, 16 quants), B = 16 weight rows (lane l: row
//! l % 16), C lane l = row l % 16 for tokens 2v + l / 16. Per 32-value block two WMMA steps give
//! the exact int32 dots; `acc += (dot as f32) * (d_w * d_x)` in block order.
use crate::abi::WAVES_PER_WG;
use super::unroll;
use crate::arch::{group_id, lane_id, read_lane_f32, wave_id, wmma_i32_i8};
use crate::mem::{ld_u16, ld_u32x4};
use quant::f16_to_f32;

/// Q8_0 weights (34-byte blocks) x Q8_1 activations (36-byte blocks).
#[unsafe(no_mangle)]
pub extern "gpu-kernel" fn mmq_q8_0(w: *const u8, x: *const u8, y: *mut f32, nrows: u32, ncols: u32, k: u32, y_stride: u32) {
    let n_rb = nrows.div_ceil(16 * WAVES_PER_WG);
    let g = group_id();
    if n_rb == 0 || g >= n_rb * ncols.div_ceil(16) {
        return;
    }
    let (rb, cb) = (g % n_rb, g / n_rb);
    let r0 = rb * 16 * WAVES_PER_WG + wave_id() * 16;
    if r0 >= nrows {
        return; // wave-uniform
    }
    let c0 = cb * 16;
    let lane = lane_id();
    let (me, half) = (lane & 15, lane >> 4);
    let nb = k / 32;
    // Loads of rows / tokens past the end are clamped (their results are not stored).
    let wr = (r0 + me).min(nrows - 1);
    let xc = (c0 + me).min(ncols - 1);
    // SAFETY: ABI (abi::MmqArgs): w = nrows rows of nb Q8_0 blocks, x = ncols columns of nb
    // Q8_1 blocks, y = ncols columns of y_stride >= nrows f32; indices are clamped in range;
    // each output is stored by one lane.
    unsafe {
        let wrow = w.add((wr * nb * 34) as usize);
        let xcol = x.add((xc * nb * 36) as usize);
        let mut acc = [0f32; 8];
        for b in 0..nb {
            let wb = wrow.add((b * 34) as usize);
            let xb = xcol.add((b * 36) as usize);
            let dw = f16_to_f32(ld_u16(wb));
            // This lane's token scale; element v needs token 2v + half's (v_readlane).
            let dxl = f16_to_f32(ld_u16(xb));
            // Both half-waves load the whole 16-byte fragments (same addresses: one memory
            // transaction on hardware; splitting them with permlanex16 cost more instructions).
            let mut c = [0i32; 8];
            c = wmma_i32_i8(ld_u32x4(xb.add(4)), ld_u32x4(wb.add(2)), c);
            c = wmma_i32_i8(ld_u32x4(xb.add(20)), ld_u32x4(wb.add(18)), c);
            unroll::<8>(|v| {
                let (a, b2) = (read_lane_f32(dxl, 2 * v as u32), read_lane_f32(dxl, 2 * v as u32 + 1));
                let dx = if half == 0 { a } else { b2 };
                acc[v] += c[v] as f32 * (dw * dx);
            });
        }
        let r = r0 + me;
        if r < nrows {
            for v in 0..8u32 {
                let t = c0 + 2 * v + half;
                if t < ncols {
                    *y.add((t * y_stride + r) as usize) = acc[v as usize];
                }
            }
        }
    }
}
