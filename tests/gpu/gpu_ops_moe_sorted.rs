//! A prompt chunk's routed experts with the slots sorted by expert first (`moe_sort_slots`,
//! then `mmvq_moe_*` over consecutive sorted slots reading their token through a column list):
//! every slot's output equals the unsorted dispatch's (token groups of `MOE_MAX_SLOTS / k`) bit
//! for bit, at its sorted row; and at Flash-Next's routing density (64 tokens, top-10 of 512)
//! the sorted dispatch reads fewer bytes (the software device counts them). Runs as
//! `<name>::emu` and `<name>::hip` through `test_device!`.

use crate::gpu::gpu_ops::*;
use quant::GgmlType;
use strata::gpu::abi::{self, WType};
use strata::gpu::ops::{GluAct, GpuOps, SlotCols};
use strata::kernel_tools::bench::{random_blocks, random_routing};
use strata::rng::SplitMix64;
use strata::test_device;

/// Global bytes the device moved since the last call (the software device; None on HIP).
fn moved(ops: &GpuOps) -> Option<u64> {
    ops.api().synchronize().expect("synchronize");
    ops.api().take_stats().map(|s| s.global_bytes_read + s.global_bytes_written)
}

test_device!(
    fn gpu_ops_moe_sorted_dispatch_equals_the_unsorted(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(29);
        // (types, tokens, k, experts, rows, k of a row): many tokens per expert (passes of up
        // to 8 columns), and Flash-Next's density (about one token per expert).
        let cases: [(&[WType], usize, usize, usize, usize, usize); 2] =
            [(&WType::ALL, 24, 4, 6, 32, 256), (&[WType::IQ3XXS, WType::Q8_0], 64, 10, 512, 16, 256)];
        for (types, nt, k, ne, nrows, kd) in cases {
            for &ty in types {
                let bk = ty.block_k() as usize;
                let mat = nrows * kd / bk * ty.block_bytes() as usize;
                let (wg, wu) = (random_blocks(ty, ne * nrows * kd / bk, &mut rng), random_blocks(ty, ne * nrows * kd / bk, &mut rng));
                let ids = random_routing(&mut rng, nt, k, ne);
                let ns = nt * k;
                let x = rng.symmetric_vec(nt * kd, 1.0);
                let mut xq = vec![0u8; nt * kd / 32 * 36];
                quant::quantize_row(GgmlType::Q8_1, &x, &mut xq).unwrap();
                let colb = (kd / 32 * 36) as u64;
                let (gb, ub, xb, ib) = (up(ops, &wg), up(ops, &wu), up(ops, &xq), upu(ops, &ids));
                let what = format!("{ty:?} {nt} tokens x {k} of {ne} experts");
                for glu in [None, Some((ub.ptr, GluAct::Silu))] {
                    let form = if glu.is_some() { "glu" } else { "plain" };
                    // Unsorted: token groups whose slots fit one launch.
                    let y_un = zeros(ops, ns * nrows * 4);
                    let group = (abi::MOE_MAX_SLOTS as usize / k).clamp(1, abi::MAX_COLS);
                    moved(ops);
                    for t0 in (0..nt).step_by(group) {
                        let tn = (nt - t0).min(group);
                        let (s0, sn) = (t0 * k, tn * k);
                        ops.mmvq_moe(&S, ty, glu, gb.ptr, mat as u64, ne as u32, xb.ptr + t0 as u64 * colb, k as u32, ib.ptr + (s0 * 4) as u64, sn as u32, y_un.ptr + (s0 * nrows * 4) as u64, nrows as u32, kd as u32, tn as u32)
                            .unwrap_or_else(|e| panic!("{name} {what} {form} unsorted: {e}"));
                    }
                    let bytes_un = moved(ops);
                    // Sorted: the ids ordered by expert, launches over consecutive sorted slots.
                    let (sb, cb, mb) = (zeros(ops, ns * 4), zeros(ops, ns * 4), zeros(ops, ns * 4));
                    let y_s = zeros(ops, ns * nrows * 4);
                    ops.moe_sort_slots(&S, ib.ptr, sb.ptr, cb.ptr, mb.ptr, ns as u32, k as u32).unwrap();
                    let step = abi::MOE_MAX_SLOTS as usize;
                    for s0 in (0..ns).step_by(step) {
                        let sn = (ns - s0).min(step);
                        let cols = SlotCols::List(cb.ptr + (s0 * 4) as u64);
                        ops.mmvq_moe(&S, ty, glu, gb.ptr, mat as u64, ne as u32, xb.ptr, cols, sb.ptr + (s0 * 4) as u64, sn as u32, y_s.ptr + (s0 * nrows * 4) as u64, nrows as u32, kd as u32, abi::MAX_COLS as u32)
                            .unwrap_or_else(|e| panic!("{name} {what} {form} sorted: {e}"));
                    }
                    let bytes_s = moved(ops);
                    // Slot j's row is row map[j] of the sorted output, bit for bit.
                    let (un, sorted, map) = (y_un.f32s(), y_s.f32s(), mb.u32s());
                    let mut seen = vec![false; ns];
                    for j in 0..ns {
                        let p = map[j] as usize;
                        assert!(p < ns && !seen[p], "{name} {what}: slot {j} maps to row {p}");
                        seen[p] = true;
                        let (a, b) = (&un[j * nrows..(j + 1) * nrows], &sorted[p * nrows..(p + 1) * nrows]);
                        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{name} {what} {form}: slot {j} (row {p}) differs");
                    }
                    if let (Some(un), Some(s)) = (bytes_un, bytes_s) {
                        eprintln!("{name} {what} {form}: {un} bytes unsorted, {s} sorted (sort included)");
                        if ne > abi::MOE_MAX_SLOTS as usize {
                            assert!(s * 10 < un * 8, "{name} {what} {form}: sorting saves under 20% ({s} vs {un} bytes)");
                        }
                    }
                }
            }
        }
        // A column list at address 0 is refused, not read; a slot count that is not whole tokens too.
        let xb = zeros(ops, 36 * 8);
        let y = zeros(ops, 32 * 4 * 2);
        let w = random_blocks(WType::Q8_0, 2 * 32 * 8, &mut rng);
        let wb = up(ops, &w);
        let ib = upu(ops, &[0, 1]);
        assert!(ops.mmvq_moe(&S, WType::Q8_0, None, wb.ptr, (32 * 8 * 34) as u64, 2, xb.ptr, SlotCols::List(0), ib.ptr, 2, y.ptr, 32, 256, 1).is_err());
        assert!(ops.moe_sort_slots(&S, ib.ptr, 0, 0, 0, 3, 2).is_err(), "3 slots of 2 a token");
    }
);
