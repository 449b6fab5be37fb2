//! The `GpuApi` device boundary (feature `gpu`): the software-device implementation against
//! independent references (the `quant` crate's scalar dequantizers, a plain f64 GEMM), graph
//! replay against eager launches, the pinned → pageable fallback; the HIP implementation's
//! clean failure without ROCm, and its real dlopen path against stand-in `libamdhip64.so`
//! libraries built here with gcc (a gfx1100 that must be accepted, a gfx1030, a wave64 part,
//! a ROCm 5 runtime and a runtime lacking a symbol that must be refused with clear messages).

use crate::support::fake_hip;
use quant::GgmlType;
use strata::gpu::abi::{self, DequantArgs, WType};
use strata::gpu::device::{
    ComputeType, DType, Device, EmuApi, Gemm, GpuApi, GpuError, HipApi, HipConfig, HostAllocOptions, Kernel,
    KernelSpec, LaunchConfig, Module, Stream, Transpose, open_device,
};
use strata::kernel_tools::bench::random_blocks;
use strata::rng::SplitMix64;

fn ggml(ty: WType) -> GgmlType {
    GgmlType::from_u32(ty.ggml_id()).expect("abi ggml id is a GgmlType")
}

fn dequant_spec(name: &str) -> KernelSpec<'_> {
    KernelSpec {
        name,
        kernarg_bytes: DequantArgs::SIZE as u32,
        max_block: [abi::WG_SIZE, 1, 1],
        max_dynamic_lds: 0,
        // dequant kernels may spill (they are not hot), as their registry entries allow.
        allow_scratch: true,
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
fn bytes_f32(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn emu_with_dequant(ty: WType) -> (EmuApi, Module, Kernel) {
    let api = EmuApi::new().expect("software device");
    let m = api.load_module().expect("load the embedded gfx1100 code object");
    let name = abi::dequant_kernel(ty, false).expect("dequant kernel in gpu-abi");
    let k = api.function(&m, &dequant_spec(name)).expect("metadata check passes for the real spec");
    (api, m, k)
}

fn dequant_launch(api: &dyn GpuApi, s: &Stream, k: &Kernel, w: u64, y: u64, nblocks: u32) {
    let args = DequantArgs { w, y, nblocks, _pad: 0 };
    let cfg =
        LaunchConfig { grid: [nblocks.div_ceil(abi::WG_SIZE), 1, 1], block: [abi::WG_SIZE, 1, 1], dynamic_lds: 0 };
    api.launch(s, k, &cfg, &args.to_bytes()).expect("dequant launch");
}

// ---------------------------------------------------------------- metadata checks

#[test]
fn emu_function_lookup_checks_kernel_metadata() {
    let (api, m, good) = emu_with_dequant(WType::Q8_0);
    assert_eq!(good.kernarg_bytes, 24);
    assert_eq!(good.info.wavefront_size, 32);
    let name = abi::dequant_kernel(WType::Q8_0, false).unwrap();

    let e = api.function(&m, &KernelSpec { kernarg_bytes: 16, ..dequant_spec(name) }).unwrap_err();
    assert!(matches!(&e, GpuError::KernelCheck { kernel, .. } if kernel == name), "{e}");
    assert!(e.to_string().contains("kernarg size mismatch") && e.to_string().contains("24"), "{e}");

    let e = api.function(&m, &KernelSpec { max_block: [2048, 1, 1], ..dequant_spec(name) }).unwrap_err();
    assert!(e.to_string().contains("max_flat_workgroup_size"), "{e}");

    let e = api.function(&m, &KernelSpec { max_dynamic_lds: 70_000, ..dequant_spec(name) }).unwrap_err();
    assert!(e.to_string().contains("LDS"), "{e}");

    let e = api.function(&m, &dequant_spec("no_such_kernel")).unwrap_err();
    assert!(matches!(e, GpuError::NoSuchKernel { .. }), "{e}");

    // Launch-time checks fire before the device runs anything.
    let s = Stream::DEFAULT;
    let cfg = LaunchConfig { grid: [1, 1, 1], block: [abi::WG_SIZE, 1, 1], dynamic_lds: 0 };
    let e = api.launch(&s, &good, &cfg, &[0u8; 16]).unwrap_err();
    assert!(matches!(&e, GpuError::Launch { .. }) && e.to_string().contains("16 bytes"), "{e}");
    let e = api.launch(&s, &good, &LaunchConfig { block: [1024, 2, 1], ..cfg }, &[0u8; 24]).unwrap_err();
    assert!(e.to_string().contains("exceeds"), "{e}");
    let e = api.launch(&s, &good, &LaunchConfig { grid: [0, 1, 1], ..cfg }, &[0u8; 24]).unwrap_err();
    assert!(e.to_string().contains("empty grid"), "{e}");
    let e = api.launch(&s, &good, &LaunchConfig { dynamic_lds: 65537, ..cfg }, &[0u8; 24]).unwrap_err();
    assert!(e.to_string().contains("LDS"), "{e}");
}

#[test]
fn module_metadata_lists_every_abi_kernel() {
    let api = EmuApi::new().unwrap();
    let m = api.load_module().unwrap();
    for k in strata::gpu::registry::for_arch(&api.info().arch).map(|e| e.name) {
        assert!(m.kernels.iter().any(|i| i.name == k), "kernel {k} missing from module metadata");
    }
}

// ---------------------------------------------------------------- memory

#[test]
fn emu_malloc_copy_round_trip() {
    let api = open_device(Device::Emu).expect("emu opens");
    assert_eq!(api.info().arch, "gfx1100");
    let n = 4099usize; // odd size: no alignment assumptions
    let src: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
    let a = api.malloc(n).unwrap();
    let b = api.malloc(n).unwrap();
    api.memcpy_htod(a, &src).unwrap();
    api.memcpy_dtod(b, a, n).unwrap();
    let mut out = vec![0u8; n];
    api.memcpy_dtoh(&mut out, b).unwrap();
    assert_eq!(out, src);
    api.memset(b + 100, 0xAB, 50).unwrap();
    api.memcpy_dtoh(&mut out, b).unwrap();
    assert!(out[100..150].iter().all(|&x| x == 0xAB) && out[..100] == src[..100] && out[150..] == src[150..]);

    // Async copies through pinned host buffers on a created stream, ordered by an event.
    let s = api.stream_create().unwrap();
    let ev = api.event_create().unwrap();
    let hin = api.host_alloc(n, HostAllocOptions { mapped: true, allow_pageable_fallback: false }).unwrap();
    let hout = api.host_alloc(n, HostAllocOptions::default()).unwrap();
    assert!(hin.is_pinned() && hin.device_ptr().is_some() && hin.fallback().is_none());
    api.host_write(&hin, 0, &src).unwrap();
    api.memcpy_htod_async(&s, a, &hin, 0, n).unwrap();
    api.memset_async(&s, b, 0, n).unwrap();
    api.memcpy_dtod_async(&s, b, a, n).unwrap();
    api.memcpy_dtoh_async(&s, &hout, 0, b, n).unwrap();
    api.event_record(&ev, &s).unwrap();
    api.event_synchronize(&ev).unwrap();
    api.stream_synchronize(&s).unwrap();
    let mut got = vec![0u8; n];
    api.host_read(&hout, 0, &mut got).unwrap();
    assert_eq!(got, src);
    // Out-of-range host access is an error, not a panic.
    assert!(api.host_read(&hout, n - 1, &mut [0u8; 2]).is_err());
    api.host_free(hin).unwrap();
    api.host_free(hout).unwrap();
    api.event_destroy(ev).unwrap();
    api.stream_destroy(s).unwrap();
    api.free(a).unwrap();
    api.free(b).unwrap();
    assert!(api.free(a).is_err(), "double free is reported");
}

#[test]
fn emu_pinned_failure_falls_back_to_pageable() {
    let emu = EmuApi::new().unwrap();
    emu.device().set_fail_large_pinned_alloc(Some(1 << 20));
    let api: &dyn GpuApi = &emu;
    let small = api.host_alloc(4096, HostAllocOptions { mapped: true, allow_pageable_fallback: true }).unwrap();
    assert!(small.is_pinned() && small.fallback().is_none());

    let e = api.host_alloc(2 << 20, HostAllocOptions { mapped: true, allow_pageable_fallback: false }).unwrap_err();
    assert!(matches!(e, GpuError::PinnedAlloc { bytes, .. } if bytes == 2 << 20), "{e}");

    let big = api.host_alloc(2 << 20, HostAllocOptions { mapped: true, allow_pageable_fallback: true }).unwrap();
    assert!(!big.is_pinned() && big.device_ptr().is_none());
    let why = big.fallback().expect("fallback reported");
    assert!(why.contains("pinned") && why.contains("pageable"), "{why}");

    // The pageable buffer still works for stream copies, and inside a captured graph.
    let s = api.stream_create().unwrap();
    let d = api.malloc(big.len()).unwrap();
    let pattern: Vec<u8> = (0..big.len()).map(|i| (i % 251) as u8).collect();
    api.host_write(&big, 0, &pattern).unwrap();
    api.begin_capture(&s).unwrap();
    api.memcpy_htod_async(&s, d, &big, 0, big.len()).unwrap();
    api.memcpy_dtoh_async(&s, &small, 0, d + 1000, 4096).unwrap();
    let g = api.end_capture(&s).unwrap();
    api.launch_graph(&g, &s).unwrap();
    let mut got = vec![0u8; 4096];
    api.host_read(&small, 0, &mut got).unwrap();
    assert_eq!(got, pattern[1000..1000 + 4096]);
    api.graph_destroy(g).unwrap();
    api.host_free(big).unwrap();
    api.host_free(small).unwrap();
    api.stream_destroy(s).unwrap();
}

// ---------------------------------------------------------------- kernels and graphs

#[test]
fn emu_dequant_launch_matches_quant_reference() {
    for ty in [WType::Q8_0, WType::Q4K, WType::Q6K] {
        let (api, _m, k) = emu_with_dequant(ty);
        let mut rng = SplitMix64::new(0x5EED ^ ty.ggml_id() as u64);
        let nblocks = 300usize; // two workgroups, the second partial
        let w = random_blocks(ty, nblocks, &mut rng);
        let n = nblocks * ty.block_k() as usize;
        let mut want = vec![0f32; n];
        quant::dequantize_row(ggml(ty), &w, &mut want).unwrap();

        let dw = api.malloc(w.len()).unwrap();
        let dy = api.malloc(n * 4).unwrap();
        api.memcpy_htod(dw, &w).unwrap();
        dequant_launch(&api, &Stream::DEFAULT, &k, dw, dy, nblocks as u32);
        let mut out = vec![0u8; n * 4];
        api.memcpy_dtoh(&mut out, dy).unwrap();
        let got = f32s(&out);
        let bad = (0..n).find(|&i| got[i].to_bits() != want[i].to_bits());
        assert!(
            bad.is_none(),
            "{ty:?}: first mismatch at {bad:?}: got {} want {}",
            got[bad.unwrap()],
            want[bad.unwrap()]
        );
        let st = api.take_stats().expect("emu counts");
        assert!(st.instructions > 0 && st.global_bytes_written >= (n * 4) as u64, "{st:?}");
    }
}

#[test]
fn emu_graph_replay_after_input_change_equals_eager() {
    let ty = WType::Q4K;
    let (api, _m, k) = emu_with_dequant(ty);
    let nblocks = 64usize;
    let n = nblocks * 256;
    let wbytes = nblocks * ty.block_bytes() as usize;
    let s = api.stream_create().unwrap();
    let hin = api.host_alloc(wbytes, HostAllocOptions { mapped: true, allow_pageable_fallback: true }).unwrap();
    let hout = api.host_alloc(n * 4, HostAllocOptions { mapped: true, allow_pageable_fallback: true }).unwrap();
    let dw = api.malloc(wbytes).unwrap();
    let dy = api.malloc(n * 4).unwrap();
    let dz = api.malloc(n * 4).unwrap();
    api.memset(dz, 0, n * 4).unwrap();
    // GEMM in the graph too: z = 2 * y (as a 1×n by 1×1 product), accumulating onto z (beta=1).
    let scale = api.malloc(4).unwrap();
    api.memcpy_htod(scale, &2f32.to_le_bytes()).unwrap();
    let gemm = Gemm {
        trans_a: Transpose::N,
        trans_b: Transpose::N,
        m: n,
        n: 1,
        k: 1,
        alpha: 1.0,
        a: dy,
        a_type: DType::F32,
        lda: n,
        stride_a: 0,
        b: scale,
        b_type: DType::F32,
        ldb: 1,
        stride_b: 0,
        beta: 1.0,
        c: dz,
        c_type: DType::F32,
        ldc: n,
        stride_c: 0,
        batch: 1,
        compute: ComputeType::F32,
    };

    api.begin_capture(&s).unwrap();
    api.memcpy_htod_async(&s, dw, &hin, 0, wbytes).unwrap();
    dequant_launch(&api, &s, &k, dw, dy, nblocks as u32);
    api.gemm(&s, &gemm).unwrap();
    api.memcpy_dtoh_async(&s, &hout, 0, dy, n * 4).unwrap();
    let g = api.end_capture(&s).unwrap();
    // Capture recorded, did not run: the output is still zero.
    let mut z = vec![0u8; n * 4];
    api.memcpy_dtoh(&mut z, dz).unwrap();
    assert!(z.iter().all(|&b| b == 0), "captured work must not run at capture time");

    let mut rng = SplitMix64::new(42);
    let mut z_want = vec![0f32; n];
    for step in 0..3 {
        let w = random_blocks(ty, nblocks, &mut rng);
        api.host_write(&hin, 0, &w).unwrap();
        api.launch_graph(&g, &s).unwrap();
        api.stream_synchronize(&s).unwrap();
        let mut graph_out = vec![0u8; n * 4];
        api.host_read(&hout, 0, &mut graph_out).unwrap();

        // Eager: the same work issued directly, into a separate output buffer.
        let dy2 = api.malloc(n * 4).unwrap();
        let dw2 = api.malloc(wbytes).unwrap();
        api.memcpy_htod(dw2, &w).unwrap();
        dequant_launch(&api, &Stream::DEFAULT, &k, dw2, dy2, nblocks as u32);
        let mut eager = vec![0u8; n * 4];
        api.memcpy_dtoh(&mut eager, dy2).unwrap();
        assert_eq!(graph_out, eager, "step {step}: graph replay differs from eager launch");

        let mut want = vec![0f32; n];
        quant::dequantize_row(ggml(ty), &w, &mut want).unwrap();
        assert_eq!(f32s(&graph_out), want, "step {step}: differs from quant reference");
        for i in 0..n {
            z_want[i] += 2.0 * want[i];
        }
        api.memcpy_dtoh(&mut z, dz).unwrap();
        assert_eq!(f32s(&z), z_want, "step {step}: captured GEMM accumulated wrong");
        api.free(dy2).unwrap();
        api.free(dw2).unwrap();
    }
    // Capture misuse is a typed error.
    assert!(matches!(api.end_capture(&s), Err(GpuError::Capture(_))));
    assert!(matches!(api.begin_capture(&Stream::DEFAULT), Err(GpuError::Capture(_))));
    api.graph_destroy(g).unwrap();
}

// ---------------------------------------------------------------- GEMM

/// Plain f64 reference of the BLAS column-major definition.
fn gemm_ref(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f64]) {
    for p in 0..g.batch {
        for j in 0..g.n {
            for i in 0..g.m {
                let mut acc = 0f64;
                for l in 0..g.k {
                    let av = if g.trans_a == Transpose::N {
                        a[p * g.stride_a + i + l * g.lda]
                    } else {
                        a[p * g.stride_a + l + i * g.lda]
                    };
                    let bv = if g.trans_b == Transpose::N {
                        b[p * g.stride_b + l + j * g.ldb]
                    } else {
                        b[p * g.stride_b + j + l * g.ldb]
                    };
                    acc += av as f64 * bv as f64;
                }
                let ci = p * g.stride_c + i + j * g.ldc;
                c[ci] = g.alpha as f64 * acc + g.beta as f64 * c[ci];
            }
        }
    }
}

#[test]
fn emu_gemm_matches_f64_reference_all_transposes_f32_and_f16() {
    let api = EmuApi::new().unwrap();
    let mut rng = SplitMix64::new(7);
    let (m, n, k, batch) = (13usize, 5usize, 37usize, 2usize);
    for dtype in [DType::F32, DType::F16] {
        for (ta, tb) in [
            (Transpose::N, Transpose::N),
            (Transpose::T, Transpose::N),
            (Transpose::N, Transpose::T),
            (Transpose::T, Transpose::T),
        ] {
            let lda = if ta == Transpose::N { m } else { k } + 3;
            let ldb = if tb == Transpose::N { k } else { n } + 1;
            let ldc = m + 2;
            let cols_a = if ta == Transpose::N { k } else { m };
            let cols_b = if tb == Transpose::N { n } else { k };
            let (sa, sb, sc) = (lda * cols_a, ldb * cols_b, ldc * n);
            let round = |x: f32| if dtype == DType::F16 { quant::f16_to_f32(quant::f32_to_f16(x)) } else { x };
            let a: Vec<f32> = (0..sa * batch).map(|_| round(rng.symmetric() * 2.0 - 1.0)).collect();
            let b: Vec<f32> = (0..sb * batch).map(|_| round(rng.symmetric() * 2.0 - 1.0)).collect();
            let c0: Vec<f32> = (0..sc * batch).map(|_| round(rng.symmetric())).collect();
            let enc = |v: &[f32]| -> Vec<u8> {
                match dtype {
                    DType::F16 => v.iter().flat_map(|&x| quant::f32_to_f16(x).to_le_bytes()).collect(),
                    _ => bytes_f32(v),
                }
            };
            let (da, db, dc) = (
                api.malloc(sa * batch * dtype.size()).unwrap(),
                api.malloc(sb * batch * dtype.size()).unwrap(),
                api.malloc(sc * batch * dtype.size()).unwrap(),
            );
            api.memcpy_htod(da, &enc(&a)).unwrap();
            api.memcpy_htod(db, &enc(&b)).unwrap();
            api.memcpy_htod(dc, &enc(&c0)).unwrap();
            let g = Gemm {
                trans_a: ta,
                trans_b: tb,
                m,
                n,
                k,
                alpha: 0.75,
                a: da,
                a_type: dtype,
                lda,
                stride_a: sa,
                b: db,
                b_type: dtype,
                ldb,
                stride_b: sb,
                beta: 0.5,
                c: dc,
                c_type: dtype,
                ldc,
                stride_c: sc,
                batch,
                compute: ComputeType::F32,
            };
            api.gemm(&Stream::DEFAULT, &g).unwrap();
            let mut out = vec![0u8; sc * batch * dtype.size()];
            api.memcpy_dtoh(&mut out, dc).unwrap();
            let got: Vec<f32> = match dtype {
                DType::F16 => {
                    out.chunks_exact(2).map(|c| quant::f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect()
                }
                _ => f32s(&out),
            };
            let mut want: Vec<f64> = c0.iter().map(|&x| x as f64).collect();
            gemm_ref(&g, &a, &b, &mut want);
            // f32: accumulation-order error only; f16: one output rounding (2^-11 relative).
            let tol = if dtype == DType::F16 { 4e-3 } else { 1e-5 };
            for (i, (&g_, &w)) in got.iter().zip(&want).enumerate() {
                let in_c = (i % sc) % ldc < m; // padding rows between columns stay untouched
                let w = if in_c { w } else { c0[i] as f64 };
                assert!(
                    (g_ as f64 - w).abs() <= tol * (1.0 + w.abs()),
                    "{dtype:?} {ta:?}{tb:?}: C[{i}] = {g_}, want {w}"
                );
            }
            for p in [da, db, dc] {
                api.free(p).unwrap();
            }
        }
    }
    let bad = Gemm {
        trans_a: Transpose::N,
        trans_b: Transpose::N,
        m: 4,
        n: 4,
        k: 4,
        alpha: 1.0,
        a: 0,
        a_type: DType::F32,
        lda: 2,
        stride_a: 0,
        b: 0,
        b_type: DType::F32,
        ldb: 4,
        stride_b: 0,
        beta: 0.0,
        c: 0,
        c_type: DType::F32,
        ldc: 4,
        stride_c: 0,
        batch: 1,
        compute: ComputeType::F32,
    };
    let e = api.gemm(&Stream::DEFAULT, &bad).unwrap_err();
    assert!(matches!(&e, GpuError::Gemm(w) if w.contains("lda=2")), "{e}");
}

// ---------------------------------------------------------------- HIP without ROCm

fn rocm_installed() -> bool {
    let cfg = HipConfig::from_env();
    // Any runtime the loader can open, also an old one it then refuses (Debian's .so.5).
    use strata::gpu::device::hip::{HIP_NAMES, HIP_OLD_NAMES};
    cfg.lib_dirs.iter().any(|d| d.join("libamdhip64.so").exists())
        // SAFETY: loading the system's HIP runtime, as HipApi::open does.
        || HIP_NAMES.iter().chain(HIP_OLD_NAMES.iter()).any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

#[test]
fn hip_open_without_rocm_is_a_clean_error_and_auto_falls_back() {
    match open_device(Device::Hip) {
        Err(GpuError::LibraryNotFound { lib, searched }) => {
            assert_eq!(lib, "libamdhip64");
            assert!(searched.contains("/opt/rocm/lib"), "{searched}");
        }
        Err(e) => assert!(rocm_installed(), "without ROCm the error must be LibraryNotFound, got: {e}"),
        Ok(d) => eprintln!("a real HIP device is present: {:?}", d.info()),
    }
    match open_device(Device::Auto) {
        Err(e @ GpuError::NoUsableGpu(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("using the CPU"), "{msg}");
            if !rocm_installed() {
                assert!(msg.contains("libamdhip64 not found"), "{msg}");
            }
        }
        Err(e) => panic!("auto must wrap the reason in NoUsableGpu: {e}"),
        Ok(d) => assert_eq!(d.info().backend, strata::gpu::device::Device::Hip),
    }
    let e = HipApi::open(&HipConfig::only_dir(std::env::temp_dir().join("strata-no-such-dir")))
        .err()
        .expect("no library there");
    assert!(e.to_string().contains("libamdhip64 not found"), "{e}");
}

// ---------------------------------------------------------------- HIP against stand-in libraries

#[test]
fn hip_loader_accepts_a_gfx1100_stand_in_and_drives_it() {
    let Some(dir) = fake_hip("gfx1100", &[]) else { return };
    let api = HipApi::open(&HipConfig::only_dir(&dir)).expect("gfx1100 stand-in is accepted");
    let info = api.info();
    assert_eq!(info.arch, "gfx1100:sramecc-:xnack-");
    assert_eq!((info.wave_size, info.compute_units, info.vram_bytes), (32, 96, 24 << 30));
    assert!(info.runtime.contains("6.4.43483"), "{}", info.runtime);
    assert!(info.blas.is_none(), "no hipBLAS in the stand-in dir");

    // Memory and copies through the real function-pointer table.
    let n = 1000;
    let src: Vec<u8> = (0..n).map(|i| (i * 13) as u8).collect();
    let m = api.mem_info().unwrap();
    assert_eq!((m.free, m.total), (23 << 30, 24 << 30));
    // hipErrorOutOfMemory becomes the typed error with the free memory.
    match api.malloc(2 << 40) {
        Err(strata::gpu::device::GpuError::OutOfMemory { bytes, free, total }) => {
            assert_eq!((bytes, free, total), (2 << 40, 23 << 30, 24 << 30))
        }
        other => panic!("expected out of memory, got {other:?}"),
    }
    let d = api.malloc(n).unwrap();
    api.memcpy_htod(d, &src).unwrap();
    let mut out = vec![0u8; n];
    api.memcpy_dtoh(&mut out, d).unwrap();
    assert_eq!(out, src);
    let s = api.stream_create().unwrap();
    let h = api.host_alloc(n, HostAllocOptions { mapped: true, allow_pageable_fallback: false }).unwrap();
    assert!(h.is_pinned() && h.device_ptr().is_some());
    api.memcpy_dtoh_async(&s, &h, 0, d, n).unwrap();
    api.stream_synchronize(&s).unwrap();
    api.host_read(&h, 0, &mut out).unwrap();
    assert_eq!(out, src);
    let big = api.host_alloc(2 << 20, HostAllocOptions { mapped: false, allow_pageable_fallback: true }).unwrap();
    assert!(!big.is_pinned() && big.fallback().unwrap().contains("hipErrorOutOfMemory"), "{:?}", big.fallback());
    api.host_free(big).unwrap();
    // Host memory registered mapped (`--pcie-frac`): the stand-in maps it at its own address;
    // one it refuses is the typed error naming the call.
    let r = unsafe { api.host_register(src.as_ptr(), n) }.expect("mapped registration");
    assert_eq!((r.device_ptr, r.bytes), (src.as_ptr() as u64, n));
    api.memcpy_dtoh(&mut out, r.device_ptr).unwrap();
    assert_eq!(out, src);
    api.host_unregister(r).unwrap();
    let huge = vec![0u8; 2 << 20];
    match unsafe { api.host_register(huge.as_ptr(), huge.len()) } {
        Err(strata::gpu::device::GpuError::PinnedAlloc { bytes, reason }) => {
            assert!(bytes == 2 << 20 && reason.contains("hipHostRegister"), "{reason}")
        }
        other => panic!("expected a refused registration, got {other:?}"),
    }

    // Module load reads metadata from the real code object; the launch goes out with the
    // `extra` kernarg buffer (the stand-in rejects anything else).
    let m = api.load_module().expect("module load");
    let name = abi::dequant_kernel(WType::Q8_0, false).unwrap();
    let k = api.function(&m, &dequant_spec(name)).unwrap();
    assert!(api.function(&m, &KernelSpec { kernarg_bytes: 32, ..dequant_spec(name) }).is_err());
    dequant_launch(&api, &s, &k, d, d, 1);
    api.begin_capture(&s).unwrap();
    dequant_launch(&api, &s, &k, d, d, 1);
    let g = api.end_capture(&s).unwrap();
    api.launch_graph(&g, &s).unwrap();
    api.graph_destroy(g).unwrap();
    let e = api
        .gemm(
            &s,
            &Gemm {
                trans_a: Transpose::N,
                trans_b: Transpose::N,
                m: 1,
                n: 1,
                k: 1,
                alpha: 1.0,
                a: d,
                a_type: DType::F32,
                lda: 1,
                stride_a: 0,
                b: d,
                b_type: DType::F32,
                ldb: 1,
                stride_b: 0,
                beta: 0.0,
                c: d,
                c_type: DType::F32,
                ldc: 1,
                stride_c: 0,
                batch: 1,
                compute: ComputeType::F32,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("hipBLAS unavailable") && e.to_string().contains("libhipblas not found"), "{e}");
    api.host_free(h).unwrap();
    api.stream_destroy(s).unwrap();
    api.free(d).unwrap();
}

#[test]
fn hip_loader_refuses_unsupported_stand_ins_with_clear_messages() {
    let cases: [(&str, &[&str], &[&str]); 4] = [
        ("gfx1030", &["-DARCH=\"gfx1030\""], &["gfx1030", "not an RDNA3 (gfx11) GPU", "Fake Radeon", "6.4.43483"]),
        ("wave64", &["-DWARP=64"], &["wavefront size 64"]),
        ("rocm5", &["-DVERSION=50700000"], &["HIP 5.7.0", "ROCm 6.0 or newer"]),
        ("nograph", &["-DOMIT_GRAPH"], &["missing symbol hipGraphLaunch"]),
    ];
    for (variant, defines, needles) in cases {
        let Some(dir) = fake_hip(variant, defines) else { return };
        let e = HipApi::open(&HipConfig::only_dir(&dir)).err().unwrap_or_else(|| panic!("{variant}: must be refused"));
        let msg = e.to_string();
        for n in needles {
            assert!(msg.contains(n), "{variant}: message lacks {n:?}: {msg}");
        }
    }
}

// ---------------------------------------------------------------- mapped-memory handoff

/// Host worker thread ↔ captured graph, both directions, several rounds with changing payloads
/// and a late host producer: the graph waits for the host's weights (`device_recv`), dequantizes
/// them with the real kernel and hands the result back (`device_send`); the host thread checks
/// every round against the `quant` reference.
fn mailbox_rounds(pinned_fails: bool) {
    let ty = WType::Q8_0;
    let (api, _m, k) = emu_with_dequant(ty);
    if pinned_fails {
        api.device().set_fail_large_pinned_alloc(Some(0));
    }
    let nblocks = 40usize;
    let (wbytes, n) = (nblocks * ty.block_bytes() as usize, nblocks * 32);
    let to_gpu = strata::gpu::device::Mailbox::new(&api, wbytes).unwrap();
    let from_gpu = strata::gpu::device::Mailbox::new(&api, n * 4).unwrap();
    if pinned_fails {
        let why = to_gpu.fallback().expect("fallback reported");
        assert!(why.contains("pageable") && why.contains("device memory"), "{why}");
    } else {
        assert!(to_gpu.fallback().is_none());
    }
    let (dw, dy) = (api.malloc(wbytes).unwrap(), api.malloc(n * 4).unwrap());
    let s = api.stream_create().unwrap();
    api.begin_capture(&s).unwrap();
    to_gpu.device_recv(&api, &s, dw, wbytes).unwrap();
    dequant_launch(&api, &s, &k, dw, dy, nblocks as u32);
    from_gpu.device_send(&api, &s, dy, n * 4).unwrap();
    let g = api.end_capture(&s).unwrap();

    let rounds = 4;
    std::thread::scope(|sc| {
        let worker = sc.spawn(|| {
            let mut rng = SplitMix64::new(99);
            for round in 0..rounds {
                let w = random_blocks(ty, nblocks, &mut rng);
                std::thread::sleep(std::time::Duration::from_millis(if round % 2 == 0 { 40 } else { 0 })); // late producer
                to_gpu.host_send(&api, &w).unwrap();
                let got = f32s(&from_gpu.host_recv(&api, n * 4).unwrap());
                let mut want = vec![0f32; n];
                quant::dequantize_row(ggml(ty), &w, &mut want).unwrap();
                assert_eq!(got, want, "round {round}: handoff result differs from the quant reference");
            }
        });
        for _ in 0..rounds {
            api.launch_graph(&g, &s).expect("graph replay waits for the host producer");
        }
        worker.join().expect("host worker");
    });
    api.graph_destroy(g).unwrap();
    to_gpu.free(&api).unwrap();
    from_gpu.free(&api).unwrap();
}

#[test]
fn emu_mailbox_handoff_both_directions_with_graph_replay() {
    mailbox_rounds(false);
}

#[test]
fn emu_mailbox_handoff_falls_back_to_device_memory_when_pinning_fails() {
    mailbox_rounds(true);
}
