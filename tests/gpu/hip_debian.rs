//! The HIP loader against a real runtime: Debian's `libamdhip64-5` package (HIP 5.2), which
//! loads without an AMD GPU. `setup.sh --test` installs it; without it these tests print why
//! they skip. What they show: the plain library search finds a system that has only
//! `libamdhip64.so.5` and reports it by version ("too old"), the version is read from the real
//! library, every symbol of the function table but the ROCm 6.0 property struct resolves, and
//! the runtime's no-device codes are the ones the loader maps to "no AMD GPU".
use std::path::PathBuf;
use std::process::Command;

use strata::gpu::device::hip::ffi::HipFns;
use strata::gpu::device::hip::{HIP_NAMES, HIP_OLD_NAMES};
use strata::gpu::device::{GpuError, HipApi, HipConfig};

const SONAME: &str = "libamdhip64.so.5";

/// Debian's runtime and the file the loader mapped for it, or None (skip reason printed).
fn debian_hip() -> Option<(libloading::Library, PathBuf)> {
    // SAFETY: loading the HIP runtime runs its initialisers, as HipApi::open does.
    match unsafe { libloading::Library::new(SONAME) } {
        Ok(lib) => {
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
            let path = maps
                .lines()
                .filter_map(|l| l.split_whitespace().nth(5))
                .find(|p| p.contains("/libamdhip64.so.5"))
                .map_or_else(|| PathBuf::from(SONAME), PathBuf::from);
            Some((lib, path))
        }
        Err(e) => {
            eprintln!("skipping: {SONAME} is not installed ({e}); `apt-get install libamdhip64-5` provides it");
            None
        }
    }
}

/// True when a runtime the loader prefers (ROCm 6+) is also installed: then the search
/// legitimately finds that one and the "too old" path is not what a user would see.
fn newer_runtime_present() -> bool {
    let cfg = HipConfig::from_env();
    cfg.lib_dirs.iter().any(|d| HIP_NAMES.iter().any(|n| d.join(n).exists()))
        // SAFETY: as above.
        || HIP_NAMES.iter().any(|n| unsafe { libloading::Library::new(n) }.is_ok())
}

fn runtime_version(lib: &libloading::Library) -> i32 {
    // SAFETY: `hipError_t hipRuntimeGetVersion(int*)` in every HIP release.
    let f = unsafe { lib.get::<unsafe extern "C" fn(*mut i32) -> u32>(b"hipRuntimeGetVersion\0") }
        .expect("hipRuntimeGetVersion");
    let mut v = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut v) }, 0, "hipRuntimeGetVersion failed");
    v
}

/// `HIP_VERSION` encoding: major * 10^7 + minor * 10^5 + patch.
fn version_text(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

#[test]
fn hip_debian_runtime_symbols_and_version() {
    let Some((lib, path)) = debian_hip() else { return };
    let v = runtime_version(&lib);
    assert_eq!(v / 10_000_000, 5, "{SONAME} reports HIP {}", version_text(v));
    // Every function of the table resolves except the ROCm 6.0 device-property struct.
    let missing: Vec<&str> = HipFns::SYMBOLS
        .iter()
        .copied()
        .filter(|s| {
            let name = format!("{s}\0");
            // SAFETY: only the address is looked up, never called.
            unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err()
        })
        .collect();
    assert_eq!(missing, ["hipGetDevicePropertiesR0600"], "symbols of the table missing from {}", path.display());
    match HipFns::load(&lib, &path) {
        Err(GpuError::MissingSymbol { symbol: "hipGetDevicePropertiesR0600", .. }) => {}
        Err(e) => panic!("unexpected table error: {e}"),
        Ok(_) => panic!("HIP 5.2 has no hipGetDevicePropertiesR0600"),
    }
    // No card here: the runtime's answers are the codes HipApi::open maps to "no AMD GPU".
    if !std::path::Path::new("/dev/kfd").exists() {
        // SAFETY: the HIP 5.2 signatures of hipInit(unsigned) and hipGetDeviceCount(int*).
        let (init_rc, count_rc, count) = unsafe {
            let init = lib.get::<unsafe extern "C" fn(u32) -> u32>(b"hipInit\0").unwrap();
            let get_count = lib.get::<unsafe extern "C" fn(*mut i32) -> u32>(b"hipGetDeviceCount\0").unwrap();
            let mut n = -1;
            (init(0), get_count(&mut n), n)
        };
        eprintln!(
            "HIP {} without a card: hipInit -> {init_rc}, hipGetDeviceCount -> {count_rc} (count {count})",
            version_text(v)
        );
        assert!([100, 101, 35].contains(&init_rc), "hipInit returned {init_rc}");
        assert!(count_rc == 100 || count <= 0, "hipGetDeviceCount returned {count_rc}, count {count}");
    }
}

#[test]
fn hip_debian_plain_search_reports_too_old_by_version() {
    let Some((lib, path)) = debian_hip() else { return };
    if newer_runtime_present() {
        eprintln!("skipping: a ROCm 6+ runtime is installed, the search finds that one first");
        return;
    }
    let want = version_text(runtime_version(&lib));
    // The system search alone (no ROCM_PATH, no /opt/rocm) and the default configuration.
    let only_system = HipConfig { lib_dirs: vec![], system_search: true, device: 0, min_vram_bytes: 2 << 30 };
    for cfg in [only_system, HipConfig::from_env()] {
        match HipApi::open(&cfg) {
            Err(e @ GpuError::RuntimeTooOld { .. }) => {
                let msg = e.to_string();
                let GpuError::RuntimeTooOld { lib: name, path: found, version } = &e else { unreachable!() };
                assert_eq!((*name, version.as_str()), ("libamdhip64", want.as_str()));
                assert_eq!(PathBuf::from(found), path, "the message names the file the loader mapped");
                assert!(msg.contains(&format!("is HIP {want}; ROCm 6.0 or newer is needed")), "{msg}");
                eprintln!("{msg}");
            }
            Err(e) => panic!("expected 'too old' for {SONAME}, got: {e}"),
            Ok(_) => panic!("HIP 5.2 must be refused"),
        }
    }
    // The old names are searched only after the supported ones.
    assert!(HIP_OLD_NAMES.contains(&SONAME));
}

#[test]
fn hip_debian_strata_device_names_the_old_runtime() {
    let Some((lib, _)) = debian_hip() else { return };
    if newer_runtime_present() {
        eprintln!("skipping: a ROCm 6+ runtime is installed");
        return;
    }
    let want = version_text(runtime_version(&lib));
    let empty = std::env::temp_dir().join(format!("strata-hip-debian-sysfs-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["device", "--json"])
        .env("STRATA_SYSFS_ROOT", &empty)
        .env_remove("ROCM_PATH")
        .output()
        .unwrap();
    std::fs::remove_dir_all(&empty).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let err = j["hip"]["error"].as_str().unwrap_or_default();
    assert!(err.contains(&format!("HIP {want}; ROCm 6.0 or newer is needed")), "{j}");
    assert_eq!(j["backend"], "cpu", "{j}");
}
