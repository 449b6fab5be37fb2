//! `GpuOps` KV-cache and attention ops (split from `gpu_ops.rs`, same helpers): `kv_store`
//! bit for bit against the CPU cache, ordered attention bit for bit against `attend_ordered`
//! and the fast (WMMA) path within `FAST_ATTN_TOL`, the window limit as an error. Each test runs
//! as `<name>::emu` and `<name>::hip` through `test_device!`.

use crate::gpu::gpu_ops::*;
use strata::cpu::attention::{Shape, attend, attend_ordered};
use strata::gpu::ops::{AttnMode, KvFormat};
use strata::kernel_tools::selftest::reference::{FAST_ATTN_TOL, raw_kv_bytes};
use strata::kv_cache::{KvCache, KvType, LayerCache, RawRows};
use strata::rng::SplitMix64;
use strata::test_device;

/// Raw cache bytes of one tensor: (rows, scales).
fn raw_bytes(r: RawRows) -> (Vec<u8>, Vec<u8>) {
    raw_kv_bytes(r)
}

test_device!(
    fn gpu_ops_kv_store_bitwise(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(10);
        for (fmt, ty) in [(KvFormat::F16, KvType::F16), (KvFormat::Int8, KvType::Int8)] {
            for (nkv, hd, nt) in [(2usize, 64usize, 1usize), (1, 256, 3), (4, 128, 8), (3, 16, 2)] {
                let cap = 20usize;
                let mut cache = KvCache::new(ty, cap, &[(nkv, hd)]);
                let LayerCache::Attention(layer) = &mut cache.layers[0];
                let pos: Vec<u32> = (0..nt as u32).map(|i| (i * 7 + 3) % cap as u32).collect();
                let mut k = rng.symmetric_vec(nt * nkv * hd, 3.0);
                let v = rng.symmetric_vec(nt * nkv * hd, 0.5);
                k[..hd].fill(0.0); // an all-zero row: scale 0
                k[hd + 1] = 1e-30;
                let w = nkv * hd;
                for t in 0..nt {
                    layer.write(pos[t] as usize, &k[t * w..(t + 1) * w], &v[t * w..(t + 1) * w]);
                }
                let esz = if fmt == KvFormat::F16 { 2 } else { 1 };
                let pb = upu(ops, &pos);
                for (src, raw) in [(&k, layer.k_raw()), (&v, layer.v_raw())] {
                    let (want_rows, want_scales) = raw_bytes(raw);
                    let cb = zeros(ops, cap * w * esz);
                    let sb = zeros(ops, cap * nkv * 4);
                    let xb = upf(ops, src);
                    let scale_ptr = if fmt == KvFormat::Int8 { sb.ptr } else { 0 };
                    ops.kv_store(&S, fmt, xb.ptr, cb.ptr, scale_ptr, pb.ptr, nt as u32, nkv as u32, hd as u32).unwrap();
                    assert_eq!(cb.bytes(), want_rows, "{name} kv_store {fmt:?} nkv={nkv} hd={hd} rows");
                    if fmt == KvFormat::Int8 {
                        assert_eq!(sb.bytes(), want_scales, "{name} kv_store int8 scales");
                    }
                }
            }
        }
    }
);

/// Fills a cache (via the CPU `KvLayer::write`) and returns it with its raw device copies.
struct KvSetup {
    cache: KvCache,
}
fn kv_setup(ty: KvType, cap: usize, nkv: usize, hd: usize, rng: &mut SplitMix64) -> KvSetup {
    let mut cache = KvCache::new(ty, cap, &[(nkv, hd)]);
    let LayerCache::Attention(layer) = &mut cache.layers[0];
    for p in 0..cap {
        let k = rng.symmetric_vec(nkv * hd, 1.5);
        let v = rng.symmetric_vec(nkv * hd, 1.0);
        layer.write(p, &k, &v);
    }
    KvSetup { cache }
}

test_device!(
    fn gpu_ops_attention_ordered_bitwise_and_fast_within_tolerance(ops) {
        let name = device_name(ops);
        let mut rng = SplitMix64::new(11);
        // (format, head_dim, n_head, n_head_kv, n_tokens, last position, window)
        type Case = (KvType, usize, usize, usize, usize, usize, Option<usize>);
        let cases: &[Case] = &[
            (KvType::F16, 64, 4, 2, 1, 0, None),     // first token: one cell
            (KvType::F16, 128, 8, 2, 1, 77, None),   // decode, GQA 4:1
            (KvType::F16, 256, 2, 1, 8, 40, None),   // verification window of 8
            (KvType::F16, 64, 4, 4, 3, 100, Some(17)), // window cuts the past
            (KvType::F16, 32, 4, 2, 5, 9, Some(4)),
            (KvType::F16, 16, 2, 2, 2, 33, None),
            (KvType::F16, 32, 4, 2, 1, 7, None),     // head_dim 32 past 8 cells
            (KvType::F16, 32, 4, 2, 6, 5, None),     // a whole 6-token prompt from position 0
            (KvType::F16, 32, 4, 2, 8, 20, None),
            (KvType::Int8, 32, 4, 2, 3, 40, None),
            (KvType::Int8, 64, 4, 2, 1, 50, None),
            (KvType::Int8, 128, 4, 1, 8, 70, Some(32)),
            (KvType::Int8, 256, 2, 2, 2, 12, None),
            (KvType::F16, 128, 16, 2, 4, 600, None), // long context: many cell blocks per wave, 2 row tiles
            (KvType::Int8, 64, 8, 8, 1, 300, Some(128)),
        ];
        for &(ty, hd, nh, nkv, nt, last, window) in cases {
            // Free cells past the last position, as in a real cache (kernels must not read them).
            let cap = last + 1 + 9;
            let kv = kv_setup(ty, cap, nkv, hd, &mut rng);
            let LayerCache::Attention(layer) = &kv.cache.layers[0];
            let q = rng.symmetric_vec(nt * nh * hd, 1.0);
            let pos0 = last + 1 - nt;
            let kq_scale = 1.0 / (hd as f32).sqrt();
            let sh = Shape { n_head: nh, n_head_kv: nkv, head_dim: hd, pos0, window, kq_scale, ggml_exact: false };
            let mut want = vec![0f32; nt * nh * hd];
            attend_ordered(layer, &q, &mut want, sh);
            // The ordered reference is a faithful attention: close to the engine's `attend`.
            let mut normal = vec![0f32; want.len()];
            attend(layer, &q, &mut normal, sh);
            for (i, (a, b)) in want.iter().zip(&normal).enumerate() {
                assert!((a - b).abs() <= ORDERED_VS_ATTEND_TOL, "{ty:?} hd={hd}: attend_ordered [{i}] {a} vs attend {b}");
            }
            let (kr, ks) = raw_bytes(layer.k_raw());
            let (vr, vs) = raw_bytes(layer.v_raw());
            let fmt = if ty == KvType::F16 { KvFormat::F16 } else { KvFormat::Int8 };
            let pos: Vec<u32> = (0..nt).map(|i| (pos0 + i) as u32).collect();
            let (kb, vb) = (up(ops, &kr), up(ops, &vr));
            let (ksb, vsb) = (up(ops, &ks), up(ops, &vs));
            let (qb, pb) = (upf(ops, &q), upu(ops, &pos));
            let ob = zeros(ops, want.len() * 4);
            let (ksp, vsp) = if fmt == KvFormat::Int8 { (ksb.ptr, vsb.ptr) } else { (0, 0) };
            for mode in [AttnMode::Ordered, AttnMode::Fast] {
                ops.attention(&S, mode, fmt, qb.ptr, kb.ptr, ksp, vb.ptr, vsp, ob.ptr, pb.ptr, nt as u32, nh as u32, nkv as u32, hd as u32, window.unwrap_or(0) as u32, kq_scale)
                    .unwrap_or_else(|e| panic!("{name} attention {ty:?} hd={hd}: {e}"));
                let got = ob.f32s();
                if mode == AttnMode::Ordered {
                    assert_bits(name, &format!("attention {ty:?} hd={hd} nh={nh}/{nkv} nt={nt} pos={last} window={window:?}"), &got, &want);
                } else {
                    let mut worst = 0f32;
                    for (i, (a, b)) in got.iter().zip(&normal).enumerate() {
                        worst = worst.max((a - b).abs());
                        assert!(((a - b).abs() as f64) <= FAST_ATTN_TOL, "{name} fast attention {ty:?} hd={hd} nh={nh}/{nkv} nt={nt} [{i}]: {a} vs {b}");
                    }
                    println!("{name} fast attention {ty:?} hd={hd} nh={nh}/{nkv} nt={nt} pos={last} window={window:?}: worst {worst:.2e}");
                }
            }
        }
        assert!(ops.attention(&S, AttnMode::Ordered, KvFormat::F16, 0, 0, 0, 0, 0, 0, 0, 1, 4, 3, 64, 0, 1.0).is_err(), "{name}: GQA mismatch");
        assert!(ops.attention(&S, AttnMode::Ordered, KvFormat::F16, 0, 0, 0, 0, 0, 0, 0, 1, 4, 2, 96, 0, 1.0).is_err(), "{name}: head_dim 96");
        assert!(ops.attention(&S, AttnMode::Ordered, KvFormat::Int8, 0, 0, 0, 0, 0, 0, 0, 1, 4, 2, 64, 0, 1.0).is_err(), "{name}: int8 without scales");
    }
);

test_device!(
    /// A window longer than `attn_max_kv` traps on the device instead of overrunning LDS (the
    /// software device only, as before: a trap on a card aborts its queue).
    emu_only fn gpu_ops_attention_window_over_limit_is_an_error(ops) {
        let mut rng = SplitMix64::new(12);
        let kv = kv_setup(KvType::F16, 40, 1, 32, &mut rng);
        let LayerCache::Attention(layer) = &kv.cache.layers[0];
        let (kr, _) = raw_bytes(layer.k_raw());
        let (vr, _) = raw_bytes(layer.v_raw());
        ops.set_attn_max_kv(16).unwrap();
        assert!(ops.set_attn_max_kv(0).is_err());
        let (kb, vb) = (up(ops, &kr), up(ops, &vr));
        let q = rng.symmetric_vec(32, 1.0);
        let (qb, pb) = (upf(ops, &q), upu(ops, &[39]));
        let ob = zeros(ops, 32 * 4);
        let r = ops.attention(&S, AttnMode::Ordered, KvFormat::F16, qb.ptr, kb.ptr, 0, vb.ptr, 0, ob.ptr, pb.ptr, 1, 1, 1, 32, 0, 1.0);
        let e = r.expect_err("40 cells > max_kv 16 must fail").to_string();
        assert!(e.contains("trap"), "{e}");
        // With a window of 16 it fits.
        ops.attention(&S, AttnMode::Ordered, KvFormat::F16, qb.ptr, kb.ptr, 0, vb.ptr, 0, ob.ptr, pb.ptr, 1, 1, 1, 32, 16, 1.0).unwrap();
    }
);
