//! End-to-end: kernels compiled from Rust (tests/fixtures/rust_kernels.rs, built with the
//! Route 1 recipe of kernel-toolchain.md plus the LDS shim) run on the device and are checked
//! against plain host computations.
use emulator::{Device, EmuError};

mod common;

fn elf() -> &'static [u8] {
    common::fixture::rust_kernels_elf()
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}
fn to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}
fn args(ptrs: &[u64], tail: &[u32]) -> Vec<u8> {
    let mut v: Vec<u8> = ptrs.iter().flat_map(|p| p.to_le_bytes()).collect();
    for t in tail {
        v.extend_from_slice(&t.to_le_bytes());
    }
    v
}

#[test]
fn vadd() {
    let dev = Device::new();
    let m = dev.load_module(elf()).unwrap();
    let f = m.function("vadd").unwrap();
    let n = 200usize;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let b: Vec<f32> = (0..n).map(|i| 3.0 - i as f32).collect();
    let (pa, pb, po) = (dev.malloc(n * 4).unwrap(), dev.malloc(n * 4).unwrap(), dev.malloc(n * 4).unwrap());
    dev.memcpy_htod(pa, &f32s(&a)).unwrap();
    dev.memcpy_htod(pb, &f32s(&b)).unwrap();
    let st = dev.launch(&f, [4, 1, 1], [64, 1, 1], 0, &args(&[pa, pb, po], &[n as u32])).unwrap();
    let mut out = vec![0u8; n * 4];
    dev.memcpy_dtoh(&mut out, po).unwrap();
    let out = to_f32(&out);
    for i in 0..n {
        assert_eq!(out[i], a[i] + b[i] * 2.5, "index {i}");
    }
    assert_eq!(st.waves, 8);
    assert!(st.global_bytes_written >= (n * 4) as u64);
}

#[test]
fn wave_sum_dpp_permlanex16() {
    let dev = Device::new();
    let m = dev.load_module(elf()).unwrap();
    let f = m.function("wave_sum").unwrap();
    let a: Vec<f32> = (0..64).map(|i| (i * i % 17) as f32).collect();
    let (pa, po) = (dev.malloc(64 * 4).unwrap(), dev.malloc(8).unwrap());
    dev.memcpy_htod(pa, &f32s(&a)).unwrap();
    dev.launch(&f, [2, 1, 1], [32, 1, 1], 0, &args(&[pa, po], &[])).unwrap();
    let mut out = vec![0u8; 8];
    dev.memcpy_dtoh(&mut out, po).unwrap();
    let out = to_f32(&out);
    for g in 0..2 {
        assert_eq!(out[g], a[g * 32..g * 32 + 32].iter().sum::<f32>(), "group {g}");
    }
}

#[test]
fn dot4_signed() {
    let dev = Device::new();
    let m = dev.load_module(elf()).unwrap();
    let f = m.function("dot4").unwrap();
    let n = 5usize;
    let a: Vec<i32> = (0..32 * n).map(|i| (i as i32).wrapping_mul(0x9E37_79B9u32 as i32)).collect();
    let b: Vec<i32> = (0..n).map(|i| (i as i32 + 7).wrapping_mul(0x7F4A_7C15)).collect();
    let bytes = |v: &[i32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (pa, pb, po) = (dev.malloc(a.len() * 4).unwrap(), dev.malloc(n * 4).unwrap(), dev.malloc(32 * 4).unwrap());
    dev.memcpy_htod(pa, &bytes(&a)).unwrap();
    dev.memcpy_htod(pb, &bytes(&b)).unwrap();
    dev.launch(&f, [1, 1, 1], [32, 1, 1], 0, &args(&[pa, pb, po], &[n as u32])).unwrap();
    let mut out = vec![0u8; 128];
    dev.memcpy_dtoh(&mut out, po).unwrap();
    for i in 0..32 {
        let mut acc = 0i32;
        for k in 0..n {
            let (x, y) = (a[i * n + k].to_le_bytes(), b[k].to_le_bytes());
            for j in 0..4 {
                acc = acc.wrapping_add(x[j] as i8 as i32 * y[j] as i8 as i32);
            }
        }
        assert_eq!(i32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap()), acc, "lane {i}");
    }
}

#[test]
fn dispatch_packet() {
    let dev = Device::new();
    let m = dev.load_module(elf()).unwrap();
    let f = m.function("dims").unwrap();
    let po = dev.malloc(3 * 64 * 4).unwrap();
    dev.launch(&f, [3, 1, 1], [64, 1, 1], 0, &args(&[po], &[])).unwrap();
    let mut out = vec![0u8; 3 * 64 * 4];
    dev.memcpy_dtoh(&mut out, po).unwrap();
    for i in 0..192 {
        assert_eq!(u32::from_le_bytes(out[4 * i..4 * i + 4].try_into().unwrap()), 64 * 1000 + 192, "item {i}");
    }
}

#[test]
fn lds_reverse_with_barrier() {
    let dev = Device::new();
    let m = dev.load_module(elf()).unwrap();
    let a: Vec<f32> = (0..512).map(|i| i as f32).collect();
    let pa = dev.malloc(512 * 4).unwrap();
    dev.memcpy_htod(pa, &f32s(&a)).unwrap();
    for k in ["lds_static_shim", "lds_dyn_shim", "bar_lgkm", "bar_sysfence"] {
        let f = m.function(k).unwrap();
        let po = dev.malloc(512 * 4).unwrap();
        dev.launch(&f, [2, 1, 1], [256, 1, 1], if k == "lds_dyn_shim" { 1024 } else { 0 }, &args(&[pa, po], &[]))
            .unwrap();
        let mut out = vec![0u8; 512 * 4];
        dev.memcpy_dtoh(&mut out, po).unwrap();
        let out = to_f32(&out);
        for g in 0..2 {
            for t in 0..256 {
                assert_eq!(out[g * 256 + t], a[g * 256 + 255 - t], "{k} group {g} item {t}");
            }
        }
    }
}

#[test]
fn out_of_bounds_is_a_named_fault() {
    let dev = Device::new();
    let m = dev.load_module(elf()).unwrap();
    let f = m.function("vadd").unwrap();
    let (pa, pb, po) = (dev.malloc(64).unwrap(), dev.malloc(64).unwrap(), dev.malloc(64).unwrap());
    let e = dev.launch(&f, [1, 1, 1], [64, 1, 1], 0, &args(&[pa, pb, po], &[64])).unwrap_err();
    match &e {
        EmuError::MemoryFault { kernel, lane, .. } => {
            assert_eq!(kernel, "vadd");
            assert_eq!(*lane, 16);
        }
        other => panic!("expected a memory fault, got {other}"),
    }
    assert!(e.to_string().contains("global_load_b32"), "{e}");
}

#[test]
fn bad_code_objects_are_errors() {
    let dev = Device::new();
    assert!(matches!(dev.load_module(b"not an elf"), Err(EmuError::BadElf(_))));
    let mut x = elf().to_vec();
    x[48] = 0x2c; // e_flags: gfx906
    assert!(matches!(dev.load_module(&x), Err(EmuError::NotGfx11 { .. })));
    for cut in [64, 500, elf().len() / 2] {
        assert!(dev.load_module(&elf()[..cut]).is_err());
    }
}

#[test]
fn corrupted_code_objects_never_panic() {
    // flip bytes all over the fixture (headers, notes, descriptors, code): every outcome must
    // be a Result, never a panic
    let mut seed = 0x1234_5678_9abc_def0u64;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..300 {
        let mut x = elf().to_vec();
        for _ in 0..1 + next() % 8 {
            let pos = (next() % x.len() as u64) as usize;
            x[pos] = next() as u8;
        }
        let r = std::panic::catch_unwind(|| {
            let dev = Device::new();
            let _ = emulator::disassemble(&x);
            if let Ok(m) = dev.load_module(&x)
                && let Ok(f) = m.function("vadd")
            {
                let p = dev.malloc(1024).unwrap();
                let mut ka = Vec::new();
                for _ in 0..3 {
                    ka.extend_from_slice(&p.to_le_bytes());
                }
                ka.extend_from_slice(&16u32.to_le_bytes());
                dev.set_instruction_budget(100_000);
                let _ = dev.launch(&f, [1, 1, 1], [64, 1, 1], 0, &ka);
            }
        });
        assert!(r.is_ok(), "panic on a corrupted code object");
    }
}

#[test]
fn f16_and_transcendentals() {
    let dev = Device::new();
    let m = dev.load_module(elf()).unwrap();
    let f = m.function("f16_ops").unwrap();
    // h = (i - 12) / 4: exact in f16, and h*h + h stays exact
    let h16 = |x: f32| -> u16 {
        if x == 0.0 {
            return 0;
        }
        let e = x.abs().log2().floor() as i32;
        let mant = ((x.abs() / 2f32.powi(e) - 1.0) * 1024.0).round() as u16;
        (if x < 0.0 { 0x8000 } else { 0 }) | (((e + 15) as u16) << 10) | mant
    };
    let hs: Vec<f32> = (0..32).map(|i| (i as f32 - 12.0) / 4.0).collect();
    let bytes: Vec<u8> = hs.iter().flat_map(|&x| h16(x).to_le_bytes()).collect();
    let (pa, po) = (dev.malloc(64).unwrap(), dev.malloc(128).unwrap());
    dev.memcpy_htod(pa, &bytes).unwrap();
    let mut ka = Vec::new();
    for p in [pa, po] {
        ka.extend_from_slice(&p.to_le_bytes());
    }
    ka.extend_from_slice(&32u32.to_le_bytes());
    dev.launch(&f, [1, 1, 1], [32, 1, 1], 0, &ka).unwrap();
    let mut out = vec![0u8; 128];
    dev.memcpy_dtoh(&mut out, po).unwrap();
    let out = to_f32(&out);
    for i in 0..32 {
        let h = hs[i];
        let want = (h * h + h) / (1.0 + (i as f32).sqrt()) + (i as f32 * 0.1).exp() * 1e-3;
        assert!((out[i] - want).abs() <= 1e-5 * want.abs().max(1.0), "item {i}: {} vs {want}", out[i]);
    }
}
