//! `strata bench kernels`: every gfx11 kernel on the software device, with the numbers that
//! predict its speed on a real RX 7900 XTX: wave instructions executed (and per 256 weights),
//! global bytes moved against the ideal (each weight, activation and output byte once),
//! registers, LDS, and the waves per SIMD those allow.
use super::abi::{self, WType};
use super::emu_kernels::{ActQuant, EmuKernels};
use emulator::{KernelInfo, LaunchStats};
use std::fmt::Write;

/// Deterministic test data (SplitMix64).
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// `nblocks` random blocks of `ty`: random quant bytes, scales set to finite f16 values in a
/// realistic range (so every bit pattern of the quants is exercised, not just what a quantizer
/// produces).
pub fn random_blocks(ty: WType, nblocks: usize, rng: &mut Rng) -> Vec<u8> {
    let bb = ty.block_bytes() as usize;
    let mut v: Vec<u8> = (0..nblocks * bb).map(|_| rng.next_u64() as u8).collect();
    let scale_offsets: &[usize] = match ty {
        WType::Q8_0 | WType::IQ3XXS => &[0],
        WType::Q4K => &[0, 2],
        WType::Q6K => &[208],
    };
    for b in v.chunks_exact_mut(bb) {
        for &o in scale_offsets {
            let d = quant::f32_to_f16(1e-3 + 1e-2 * (rng.f32() * 0.5 + 0.5));
            b[o..o + 2].copy_from_slice(&d.to_le_bytes());
        }
    }
    v
}

/// Waves per SIMD that registers and LDS allow on gfx1100 (wave32: 1536 VGPRs per SIMD,
/// allocated in granules of 24; 128 KiB LDS per WGP of 4 SIMDs; at most 16 waves).
pub fn waves_per_simd(vgprs: u32, lds_per_wg: u32, waves_per_wg: u32) -> u32 {
    let by_vgpr = 1536 / vgprs.max(1).next_multiple_of(24);
    let by_lds = 131072u32.checked_div(lds_per_wg).map_or(16, |wgs| wgs * waves_per_wg / 4);
    by_vgpr.min(by_lds).min(16)
}

#[allow(clippy::too_many_arguments)]
fn row(out: &mut String, name: &str, shape: &str, st: &LaunchStats, info: Option<&KernelInfo>, lds: u32, ideal: u64, weights: u64) {
    let moved = st.global_bytes_read + st.global_bytes_written;
    let (v, s, static_lds) = info.map_or((0, 0, 0), |i| (i.vgpr_count, i.sgpr_count, i.group_segment_size));
    let lds = lds + static_lds;
    let per256 = if weights > 0 { format!("{:8.2}", st.instructions as f64 * 256.0 / weights as f64) } else { "       -".into() };
    let _ = writeln!(
        out,
        "{name:<24} {shape:<16} {:>12} {per256} {:>12} {:>12} {:>6.3} {v:>4} {s:>4} {lds:>6} {:>3}",
        st.instructions,
        moved,
        ideal,
        moved as f64 / ideal.max(1) as f64,
        waves_per_simd(v, lds, abi::WAVES_PER_WG),
    );
}

/// Runs every kernel on representative shapes (4096 x 4096 MMVQ for every weight type, 1 and
/// 8 columns, an MoE-style row selection) and returns a table. `quick` uses smaller shapes.
pub fn bench_kernels(quick: bool) -> String {
    let mut out = String::new();
    let ek = match EmuKernels::new() {
        Ok(k) => k,
        Err(e) => return format!("cannot load the kernels: {e}\n"),
    };
    let _ = writeln!(
        out,
        "{:<24} {:<16} {:>12} {:>8} {:>12} {:>12} {:>6} {:>4} {:>4} {:>6} {:>3}",
        "kernel", "shape", "wave-instrs", "i/256w", "bytes moved", "ideal bytes", "ratio", "vgpr", "sgpr", "lds", "w/s"
    );
    let mut rng = Rng::new(0x5eed);
    let (big, k) = if quick { (512usize, 1024usize) } else { (4096, 4096) };

    // Activation quantization.
    let x: Vec<f32> = (0..k * 8).map(|_| rng.f32()).collect();
    for (kind, name, bytes, qk) in [
        (ActQuant::Q8_1, abi::QUANTIZE_Q8_1, abi::Q8_1_BYTES, abi::QK8_1),
        (ActQuant::Q8K, abi::QUANTIZE_Q8_K, abi::Q8_K_BYTES, abi::QK_K),
    ] {
        match ek.quantize(kind, &x) {
            Ok((_, st)) => {
                let ideal = (x.len() * 4 + x.len() / qk as usize * bytes as usize) as u64;
                row(&mut out, name, &format!("{}", x.len()), &st, ek.kernel_info(name), 0, ideal, 0)
            }
            Err(e) => {
                let _ = writeln!(out, "{name}: {e}");
            }
        }
    }

    for ty in WType::ALL {
        let row_bytes = k / ty.block_k() as usize * ty.block_bytes() as usize;
        let w = random_blocks(ty, big * k / ty.block_k() as usize, &mut rng);
        for ncols in [1usize, 8] {
            let xs: Vec<f32> = (0..k * ncols).map(|_| rng.f32()).collect();
            let mut xq = vec![0u8; ncols * k / 32 * 36];
            if let Err(e) = quant::quantize_row(quant::GgmlType::Q8_1, &xs, &mut xq) {
                let _ = writeln!(out, "quantize: {e:?}");
                continue;
            }
            let name = abi::mmvq_kernel(ty, ncols as u32).unwrap_or("?");
            let lds = abi::mmvq_lds_bytes(ty, k as u32, ncols as u32);
            match ek.mmvq(ty, &w, k, &xq, ncols, None, None) {
                Ok((_, st)) => {
                    let ideal = (w.len() + xq.len() + ncols * big * 4) as u64;
                    row(&mut out, name, &format!("{big}x{k}"), &st, ek.kernel_info(name), lds, ideal, (big * k * ncols) as u64)
                }
                Err(e) => {
                    let _ = writeln!(out, "{name} {big}x{k}: {e}");
                }
            }
        }
        // MoE-style: 8 of 64 "experts" of 64 rows, one column.
        let experts: Vec<u32> = (0..8u32).flat_map(|e| (0..64u32).map(move |r| ((e * 7 + 3) % 64) * 64 + r)).collect();
        let wsel = &w[..(4096.min(big) / 64 * 64) * row_bytes];
        let experts: Vec<u32> = experts.into_iter().filter(|&r| (r as usize) < wsel.len() / row_bytes).collect();
        let xs: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
        let mut xq = vec![0u8; k / 32 * 36];
        if quant::quantize_row(quant::GgmlType::Q8_1, &xs, &mut xq).is_ok() && !experts.is_empty() {
            let name = abi::mmvq_kernel(ty, 1).unwrap_or("?");
            if let Ok((_, st)) = ek.mmvq(ty, wsel, k, &xq, 1, Some(&experts), None) {
                let n = experts.len();
                let ideal = (n * row_bytes + xq.len() + n * 4 + n * 4) as u64;
                let lds = abi::mmvq_lds_bytes(ty, k as u32, 1);
                row(&mut out, name, &format!("rows[{n}]x{k}"), &st, ek.kernel_info(name), lds, ideal, (n * k) as u64);
            }
        }
        // Dequantization of 256 rows.
        let nrows = if quick { 64 } else { 256 };
        let wd = &w[..nrows * row_bytes];
        for f16 in [false, true] {
            let name = abi::dequant_kernel(ty, f16).unwrap_or("?");
            let r = if f16 { ek.dequant_f16(ty, wd).map(|(_, s)| s) } else { ek.dequant_f32(ty, wd).map(|(_, s)| s) };
            match r {
                Ok(st) => {
                    let ideal = (wd.len() + nrows * k * if f16 { 2 } else { 4 }) as u64;
                    let lds = abi::dequant_lds_bytes(ty);
                    row(&mut out, name, &format!("{nrows}x{k}"), &st, ek.kernel_info(name), lds, ideal, (nrows * k) as u64)
                }
                Err(e) => {
                    let _ = writeln!(out, "{name}: {e}");
                }
            }
        }
    }
    let _ = writeln!(
        out,
        "wave-instrs = wave instructions executed; i/256w = per 256 weights (and column); ratio = bytes moved / ideal \
         (weights + activations + outputs once); w/s = waves per SIMD allowed by VGPRs and LDS (gfx1100)"
    );
    out
}
