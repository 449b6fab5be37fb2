//! Test support shared by the test modules: the `strata` binary under test, per-process
//! scratch directories and a stand-in HIP runtime. (Reference data and the fetched models: `models_util`; the device
//! list: `strata::test_device!`; random data: `strata::rng::SplitMix64`.)

use std::path::PathBuf;
use std::process::{Command, Output};

/// The `strata` binary cargo built for these tests.
pub fn strata_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_strata"))
}

/// `strata ARGS`, run to completion.
pub fn strata_out(args: &[&str]) -> Output {
    strata_cmd().args(args).output().expect("running strata")
}

/// `$TMPDIR/strata-<area>-<pid>/` (created): one scratch directory per test module and run.
pub fn scratch_dir(area: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-{area}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("creating {}: {e}", d.display()));
    d
}

/// A fresh sequence of `m` through the engine's interface (`model::loaded`), with room for
/// `positions` (the numerics mode the model's own: Flash-Next takes it from the model, a
/// device from its options).
pub fn session(
    m: &dyn strata::engine::LoadedModel,
    kv: strata::kv_cache::KvType,
    positions: usize,
) -> Box<dyn strata::engine::Session> {
    let cfg =
        strata::engine::SessionConfig { kv, max_ctx: positions, prefill_chunk: 512, numerics: Default::default() };
    m.new_session(&cfg).expect("a session")
}

/// The Flash-Next state of a CPU session made by [`session`].
pub fn qwen4exp_state(s: &dyn strata::engine::Session) -> &strata::model::qwen4exp::SeqState {
    &s.downcast_ref::<strata::cpu::Qwen4ExpSession>().expect("a CPU Flash-Next session").st
}

/// A stand-in `libamdhip64.so`: the functions `HipApi` resolves, with device memory as host
/// memory; behaviour chosen by -D flags (ARCH, WARP, VERSION, OMIT_GRAPH).
pub(crate) const FAKE_HIP_C: &str = r#"
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
typedef int E;
#ifndef ARCH
#define ARCH "gfx1100"
#endif
#ifndef WARP
#define WARP 32
#endif
#ifndef VERSION
#define VERSION 60443483
#endif
#define NAME "Fake Radeon RX 7900 XTX"
E hipInit(unsigned f) { return 0; }
E hipRuntimeGetVersion(int *v) { *v = VERSION; return 0; }
const char *hipGetErrorString(E e) { return e == 2 ? "hipErrorOutOfMemory" : "fake hip error"; }
E hipGetDeviceCount(int *c) { *c = 1; return 0; }
E hipSetDevice(int d) { return d == 0 ? 0 : 101; }
E hipDeviceGetAttribute(int *v, int a, int d) { *v = a == 87 ? WARP : a == 63 ? 96 : 0; return 0; }
E hipDeviceGetName(char *n, int len, int d) { strncpy(n, NAME, len); return 0; }
E hipGetDevicePropertiesR0600(void *p, int d) {
    memset(p, 0, 1472); strcpy((char *)p, NAME); strcpy((char *)p + 1160, ARCH ":sramecc-:xnack-"); return 0; }
E hipDeviceTotalMem(size_t *b, int d) { *b = (size_t)24 << 30; return 0; }
E hipDeviceSynchronize(void) { return 0; }
E hipModuleLoadData(void **m, const void *img) { *m = (void *)0x1000; return memcmp(img, "\177ELF", 4) ? 200 : 0; }
E hipModuleUnload(void *m) { return 0; }
E hipModuleGetFunction(void **f, void *m, const char *n) { *f = (void *)0x2000; return m == (void *)0x1000 ? 0 : 400; }
E hipModuleLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned lds, void *s, void **params, void **extra) {
    if (params || !extra || extra[0] != (void *)1 || extra[2] != (void *)2 || extra[4] != (void *)3) return 1;
    if (*(size_t *)extra[3] != 24 || gx * bx < 256) return 1;
    return 0; }
E hipMalloc(void **p, size_t n) { if (n > ((size_t)1 << 40)) return 2; *p = malloc(n ? n : 1); return *p ? 0 : 2; }
E hipMemGetInfo(size_t *f, size_t *t) { *t = (size_t)24 << 30; *f = (size_t)23 << 30; return 0; }
E hipFree(void *p) { free(p); return 0; }
E hipHostMalloc(void **p, size_t n, unsigned f) { if (n > (1 << 20)) return 2; *p = calloc(1, n); return 0; }
E hipHostFree(void *p) { free(p); return 0; }
E hipHostGetDevicePointer(void **d, void *h, unsigned f) { *d = h; return 0; }
E hipHostRegister(void *h, size_t n, unsigned f) { if (f != 2) return 1; if (n > (1 << 20)) return 2; return 0; }
E hipHostUnregister(void *h) { return 0; }
E hipMemcpy(void *d, const void *s, size_t n, int k) { memcpy(d, s, n); return 0; }
E hipMemcpyAsync(void *d, const void *s, size_t n, int k, void *st) { memcpy(d, s, n); return 0; }
E hipMemset(void *d, int v, size_t n) { memset(d, v, n); return 0; }
E hipMemsetAsync(void *d, int v, size_t n, void *s) { memset(d, v, n); return 0; }
E hipStreamCreateWithFlags(void **s, unsigned f) { *s = malloc(1); return 0; }
E hipStreamDestroy(void *s) { free(s); return 0; }
E hipStreamSynchronize(void *s) { return 0; }
E hipStreamWaitEvent(void *s, void *e, unsigned f) { return 0; }
/* Simulated device clock (ms): stand-in libraries linked against this one (hipBLASLt) advance
   it by a fixed cost per operation; events record it, so timings are deterministic. */
double fake_clock_ms = 0.0;
E hipEventCreateWithFlags(void **e, unsigned f) { *e = calloc(1, sizeof(double)); return 0; }
E hipEventDestroy(void *e) { free(e); return 0; }
E hipEventRecord(void *e, void *s) { *(double *)e = fake_clock_ms; return 0; }
E hipEventElapsedTime(float *ms, void *a, void *b) { *ms = (float)(*(double *)b - *(double *)a); return 0; }
E hipEventSynchronize(void *e) { return 0; }
E hipStreamBeginCapture(void *s, int mode) { return s ? 0 : 1; }
E hipStreamEndCapture(void *s, void **g) { *g = (void *)0x3000; return 0; }
E hipGraphInstantiate(void **e, void *g, void **n, char *log, size_t sz) { *e = (void *)0x4000; return 0; }
#ifndef OMIT_GRAPH
E hipGraphLaunch(void *e, void *s) { return e == (void *)0x4000 ? 0 : 400; }
#endif
E hipGraphExecDestroy(void *e) { return 0; }
E hipGraphDestroy(void *g) { return 0; }
"#;

/// Builds the stand-in with `defines` into its own directory; None when gcc is unavailable.
pub(crate) fn fake_hip(variant: &str, defines: &[&str]) -> Option<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("strata-fakehip-{}-{variant}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let src = dir.join("fake_hip.c");
    std::fs::write(&src, FAKE_HIP_C).ok()?;
    let out = std::process::Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(dir.join("libamdhip64.so"))
        .arg(&src)
        .args(defines)
        .output();
    match out {
        Ok(o) if o.status.success() => Some(dir),
        Ok(o) => panic!("gcc failed on the stand-in HIP library: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            eprintln!("skipping stand-in HIP tests: gcc not runnable ({e})");
            None
        }
    }
}
