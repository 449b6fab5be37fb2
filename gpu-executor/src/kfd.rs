//! AMD GPU discovery through the amdgpu kernel driver's KFD topology in sysfs: no ROCm and no
//! `gpu` feature needed, so a CPU build can tell `setup.sh` which card is present.
//!
//! - `<root>/sys/class/kfd/kfd/topology/nodes/<n>/properties`: `key value` lines, one node per
//!   CPU socket and per GPU. CPU nodes have `gfx_target_version 0` or `simd_count 0`.
//! - arch: `gfx_target_version` v → `gfx{v/10000}{(v/100)%100:x}{v%100:x}` (110000 → gfx1100,
//!   90010 → gfx90a, 100306 → gfx1036).
//! - compute units: `simd_count / simd_per_cu` (KFD reports the enabled SIMDs; `array_count ×
//!   cu_per_simd_array` counts harvested CUs too, so it is only the fallback).
//! - VRAM and marketing name: `<root>/sys/class/drm/renderD<drm_render_minor>/device/`
//!   (`mem_info_vram_total`, `product_name` when the board has one, else the PCI ids).
//! - driver: `<root>/sys/module/amdgpu/version` (only DKMS builds of amdgpu have it) and the
//!   kernel release `<root>/proc/sys/kernel/osrelease`.
//!
//! `<root>` is `$STRATA_SYSFS_ROOT` (default `/`), so tests build fake trees in temp dirs.
//!
//! Support rule (one place, [`judge`]): a GPU is *integrated* when its arch is one AMD ships
//! only in APUs ([`APU_ARCHS`]) or it has less than [`MIN_DISCRETE_VRAM`] (2 GiB, the HIP
//! backend's minimum) of VRAM — APUs report their small BIOS carve-out there. Integrated GPUs
//! and archs without code objects ([`supported_archs`]) are listed as not supported. A malformed
//! file is a [`KfdError`] naming the file, line and value.
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Environment variable holding the root prefix of `/sys` and `/proc` (tests: a fake tree).
pub const SYSFS_ROOT_ENV: &str = "STRATA_SYSFS_ROOT";
/// Less VRAM than this marks a GPU as integrated (= `HipConfig::min_vram_bytes`).
pub const MIN_DISCRETE_VRAM: u64 = 2 << 30;
/// Archs a `--features gpu` build embeds by default (`KERNEL_GFX` in build.rs).
pub const DEFAULT_KERNEL_ARCHS: &[&str] = &["gfx1100", "gfx1101", "gfx1102"];
/// Archs AMD ships only as integrated GPUs (Carrizo, Raven/Picasso, Renoir/Cezanne, Van Gogh,
/// Rembrandt, Raphael/Granite Ridge, Mendocino, Phoenix/Hawk Point, Strix, Strix Halo, Krackan).
pub const APU_ARCHS: &[&str] = &[
    "gfx801", "gfx902", "gfx909", "gfx90c", "gfx1033", "gfx1035", "gfx1036", "gfx1037", "gfx1103", "gfx1150",
    "gfx1151", "gfx1152", "gfx1153",
];

const TOPOLOGY: &str = "sys/class/kfd/kfd/topology/nodes";

/// What went wrong reading the topology; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum KfdError {
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: line {line}: {what}")]
    Malformed { path: PathBuf, line: usize, what: String },
    #[error("{path}: no `{key}` line (not a KFD node properties file?)")]
    MissingKey { path: PathBuf, key: &'static str },
}

/// One GPU node of the topology.
#[derive(Clone, Debug, Serialize)]
pub struct KfdGpu {
    /// Position among the GPU nodes in node order (what `--gpu N` selects; ROCr enumerates
    /// GPU agents in the same order).
    pub index: usize,
    /// KFD node number (directory name).
    pub node: u32,
    pub arch: String,
    pub gfx_target_version: u64,
    /// `product_name` of the DRM device, else `AMD GPU [vendor:device]`.
    pub name: String,
    pub vendor_id: u32,
    pub device_id: u32,
    pub drm_render_minor: Option<u32>,
    pub compute_units: u32,
    pub simd_count: u32,
    pub simd_per_cu: u32,
    pub max_waves_per_simd: u32,
    pub wave_front_size: Option<u32>,
    /// `mem_info_vram_total`; None when the DRM device does not say.
    pub vram_bytes: Option<u64>,
    /// KFD `unique_id` (0 or absent: None); ROCr names the agent `GPU-<hex>` after it.
    pub unique_id: Option<u64>,
    pub integrated: bool,
    pub supported: bool,
    /// Why not supported (None when supported).
    pub why_not: Option<String>,
}

impl KfdGpu {
    /// Value for `ROCR_VISIBLE_DEVICES` that exposes only this GPU: its UUID when KFD has one,
    /// else its index (not verified on a card: ROCr's UUID format is `GPU-` + 16 hex digits).
    pub fn rocr_visible_devices(&self) -> String {
        match self.unique_id {
            Some(u) => format!("GPU-{u:016x}"),
            None => self.index.to_string(),
        }
    }

    /// `GPU 0: AMD Radeon RX 7900 XTX (gfx1100), 96 CUs, 24.0 GiB VRAM`.
    pub fn summary(&self) -> String {
        let vram = self.vram_bytes.map_or("VRAM unknown".to_string(), |v| format!("{} VRAM", gib(v)));
        format!("GPU {}: {} ({}), {} CUs, {vram}", self.index, self.name, self.arch, self.compute_units)
    }
}

/// `24.0 GiB`, `512 MiB`.
pub fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// Everything read from one root.
#[derive(Clone, Debug, Serialize)]
pub struct KfdReport {
    pub root: PathBuf,
    /// The topology directory exists (amdgpu loaded with KFD).
    pub present: bool,
    /// `/sys/module/amdgpu/version` (DKMS driver), None for the in-tree driver.
    pub driver_version: Option<String>,
    pub kernel: Option<String>,
    pub gpus: Vec<KfdGpu>,
    /// The archs that were counted as supported.
    pub supported_archs: Vec<String>,
}

impl KfdReport {
    /// `--gpu N` (must exist and be supported), else the supported GPU with the most VRAM
    /// (ties: the lower index). Ok(None): nothing supported.
    pub fn select(&self, want: Option<usize>) -> Result<Option<&KfdGpu>, String> {
        match want {
            Some(n) => {
                let g = self.gpus.get(n).ok_or_else(|| match self.gpus.len() {
                    0 => format!("--gpu {n}: no AMD GPU in the KFD topology"),
                    k => format!("--gpu {n}: there are {k} AMD GPUs (0..={})", k - 1),
                })?;
                match &g.why_not {
                    None => Ok(Some(g)),
                    Some(why) => Err(format!("--gpu {n}: {} is not supported: {why}", g.summary())),
                }
            }
            None => Ok(self.gpus.iter().filter(|g| g.supported).fold(None, |best: Option<&KfdGpu>, g| match best {
                Some(b) if b.vram_bytes.unwrap_or(0) >= g.vram_bytes.unwrap_or(0) => Some(b),
                _ => Some(g),
            })),
        }
    }
}

/// `$STRATA_SYSFS_ROOT`, default `/`.
pub fn root_from_env() -> PathBuf {
    std::env::var_os(SYSFS_ROOT_ENV).filter(|v| !v.is_empty()).map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/"))
}

/// The archs this binary has code objects for: the embedded ones with `--features gpu`, else
/// what a gpu build embeds by default.
pub fn supported_archs() -> Vec<String> {
    #[cfg(feature = "gpu")]
    {
        crate::device::embedded_archs().into_iter().map(String::from).collect()
    }
    #[cfg(not(feature = "gpu"))]
    {
        DEFAULT_KERNEL_ARCHS.iter().map(|s| s.to_string()).collect()
    }
}

/// `gfx_target_version` → arch name.
pub fn arch_name(v: u64) -> String {
    format!("gfx{}{:x}{:x}", v / 10000, (v / 100) % 100, v % 100)
}

/// Integrated? and why not supported (None = supported), by the rule of the module docs.
pub fn judge(arch: &str, vram: Option<u64>, supported: &[String]) -> (bool, Option<String>) {
    let mut why = Vec::new();
    let apu_arch = APU_ARCHS.contains(&arch);
    let small = vram.is_some_and(|v| v < MIN_DISCRETE_VRAM);
    if apu_arch {
        why.push(format!("integrated GPU ({arch} is an APU graphics core)"));
    } else if small {
        why.push(format!("integrated GPU ({} VRAM < the {} minimum)", gib(vram.unwrap_or(0)), gib(MIN_DISCRETE_VRAM)));
    }
    if !supported.iter().any(|s| s == arch) {
        let have = if supported.is_empty() { "none".to_string() } else { supported.join(", ") };
        why.push(format!("no code objects for {arch} (this build has {have})"));
    }
    (apu_arch || small, if why.is_empty() { None } else { Some(why.join("; ")) })
}

fn read(path: &Path) -> Result<String, KfdError> {
    std::fs::read_to_string(path).map_err(|source| KfdError::Read { path: path.to_path_buf(), source })
}

/// A file that may be absent (None); any other read error is an error.
fn read_optional(path: &Path) -> Result<Option<String>, KfdError> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(KfdError::Read { path: path.to_path_buf(), source }),
    }
}

/// `key value` lines → map; every value must be an unsigned integer.
pub fn parse_properties(path: &Path, text: &str) -> Result<BTreeMap<String, u64>, KfdError> {
    let mut map = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let bad = |what: String| KfdError::Malformed { path: path.to_path_buf(), line: i + 1, what };
        let mut parts = line.split_whitespace();
        let (Some(key), Some(value)) = (parts.next(), parts.next()) else {
            if line.trim().is_empty() {
                continue;
            }
            return Err(bad(format!("expected `key value`, got {line:?}")));
        };
        if parts.next().is_some() {
            return Err(bad(format!("expected `key value`, got {line:?}")));
        }
        let v = value.parse::<u64>().map_err(|_| bad(format!("{key} value {value:?} is not an unsigned integer")))?;
        map.insert(key.to_string(), v);
    }
    Ok(map)
}

/// A single unsigned integer file such as `mem_info_vram_total`.
fn parse_number_file(path: &Path, text: &str) -> Result<u64, KfdError> {
    let t = text.trim();
    t.parse::<u64>().map_err(|_| KfdError::Malformed {
        path: path.to_path_buf(),
        line: 1,
        what: format!("{t:?} is not an unsigned integer"),
    })
}

fn get(map: &BTreeMap<String, u64>, path: &Path, key: &'static str) -> Result<u64, KfdError> {
    map.get(key).copied().ok_or_else(|| KfdError::MissingKey { path: path.to_path_buf(), key })
}

fn get_u32(map: &BTreeMap<String, u64>, path: &Path, key: &'static str) -> Result<u32, KfdError> {
    let v = get(map, path, key)?;
    u32::try_from(v).map_err(|_| KfdError::Malformed {
        path: path.to_path_buf(),
        line: 0,
        what: format!("{key} value {v} does not fit 32 bits"),
    })
}

/// Reads the topology under `root` and judges each GPU against `supported` archs.
pub fn discover(root: &Path, supported: &[String]) -> Result<KfdReport, KfdError> {
    let nodes_dir = root.join(TOPOLOGY);
    let trimmed = |s: Option<String>| s.map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let mut report = KfdReport {
        root: root.to_path_buf(),
        present: nodes_dir.is_dir(),
        driver_version: trimmed(read_optional(&root.join("sys/module/amdgpu/version"))?),
        kernel: trimmed(read_optional(&root.join("proc/sys/kernel/osrelease"))?),
        gpus: Vec::new(),
        supported_archs: supported.to_vec(),
    };
    if !report.present {
        return Ok(report);
    }
    let entries = std::fs::read_dir(&nodes_dir).map_err(|source| KfdError::Read { path: nodes_dir.clone(), source })?;
    let mut nodes = Vec::new();
    for e in entries {
        let e = e.map_err(|source| KfdError::Read { path: nodes_dir.clone(), source })?;
        if let Some(n) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) {
            nodes.push(n);
        }
    }
    nodes.sort_unstable();
    for node in nodes {
        let path = nodes_dir.join(node.to_string()).join("properties");
        let props = parse_properties(&path, &read(&path)?)?;
        let gfx = get(&props, &path, "gfx_target_version")?;
        let simd_count = get_u32(&props, &path, "simd_count")?;
        if gfx == 0 || simd_count == 0 {
            continue; // a CPU node
        }
        let opt = |k: &str| props.get(k).copied();
        let simd_per_cu = get_u32(&props, &path, "simd_per_cu")?;
        let compute_units = simd_count
            .checked_div(simd_per_cu)
            .unwrap_or_else(|| (opt("array_count").unwrap_or(0) * opt("cu_per_simd_array").unwrap_or(0)) as u32);
        let drm_render_minor = opt("drm_render_minor").filter(|&m| m > 0).map(|m| m as u32);
        let (mut vram_bytes, mut product) = (None, None);
        if let Some(minor) = drm_render_minor {
            let dev = root.join(format!("sys/class/drm/renderD{minor}/device"));
            let vram_path = dev.join("mem_info_vram_total");
            if let Some(t) = read_optional(&vram_path)? {
                vram_bytes = Some(parse_number_file(&vram_path, &t)?);
            }
            product = trimmed(read_optional(&dev.join("product_name"))?);
        }
        let (vendor_id, device_id) = (get_u32(&props, &path, "vendor_id")?, get_u32(&props, &path, "device_id")?);
        let arch = arch_name(gfx);
        let (integrated, why_not) = judge(&arch, vram_bytes, supported);
        report.gpus.push(KfdGpu {
            index: report.gpus.len(),
            node,
            name: product.unwrap_or_else(|| format!("AMD GPU [{vendor_id:04x}:{device_id:04x}]")),
            arch,
            gfx_target_version: gfx,
            vendor_id,
            device_id,
            drm_render_minor,
            compute_units,
            simd_count,
            simd_per_cu,
            max_waves_per_simd: opt("max_waves_per_simd").unwrap_or(0) as u32,
            wave_front_size: opt("wave_front_size").map(|w| w as u32),
            vram_bytes,
            unique_id: opt("unique_id").filter(|&u| u != 0),
            integrated,
            supported: why_not.is_none(),
            why_not,
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake sysfs tree in a fresh temp dir (removed on drop).
    pub struct FakeSysfs {
        pub root: PathBuf,
        next_node: u32,
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }

    impl FakeSysfs {
        fn new(tag: &str) -> Self {
            let root = std::env::temp_dir().join(format!("strata-kfd-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(root.join(TOPOLOGY)).unwrap();
            let mut s = FakeSysfs { root, next_node: 0 };
            s.node("cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\n");
            s
        }
        fn node(&mut self, props: &str) -> u32 {
            let n = self.next_node;
            self.next_node += 1;
            let d = self.root.join(TOPOLOGY).join(n.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("properties"), props).unwrap();
            n
        }
        fn gpu(&mut self, gfx: u64, simds: u32, device_id: u32, minor: u32, vram: u64, name: Option<&str>) -> u32 {
            let props = format!(
                "cpu_cores_count 0\nsimd_count {simds}\nmem_banks_count 1\nmax_waves_per_simd 16\nwave_front_size 32\narray_count 12\n\
                 cu_per_simd_array 8\nsimd_per_cu 2\ngfx_target_version {gfx}\nvendor_id 4098\ndevice_id {device_id}\n\
                 drm_render_minor {minor}\nunique_id 0\n"
            );
            let n = self.node(&props);
            let dev = self.root.join(format!("sys/class/drm/renderD{minor}/device"));
            std::fs::create_dir_all(&dev).unwrap();
            std::fs::write(dev.join("mem_info_vram_total"), format!("{vram}\n")).unwrap();
            if let Some(name) = name {
                std::fs::write(dev.join("product_name"), format!("{name}\n")).unwrap();
            }
            n
        }
    }

    fn archs() -> Vec<String> {
        DEFAULT_KERNEL_ARCHS.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arch_names_from_target_versions() {
        assert_eq!(arch_name(110000), "gfx1100");
        assert_eq!(arch_name(110001), "gfx1101");
        assert_eq!(arch_name(110002), "gfx1102");
        assert_eq!(arch_name(90010), "gfx90a");
        assert_eq!(arch_name(90012), "gfx90c");
        assert_eq!(arch_name(100306), "gfx1036");
        assert_eq!(arch_name(100300), "gfx1030");
        assert_eq!(arch_name(110501), "gfx1151");
    }

    #[test]
    fn one_7900_xtx() {
        let mut t = FakeSysfs::new("xtx");
        t.gpu(110000, 192, 0x744c, 128, 24 << 30, Some("AMD Radeon RX 7900 XTX"));
        let r = discover(&t.root, &archs()).unwrap();
        assert!(r.present);
        assert_eq!(r.gpus.len(), 1);
        let g = &r.gpus[0];
        assert_eq!((g.node, g.arch.as_str(), g.compute_units, g.vram_bytes), (1, "gfx1100", 96, Some(24 << 30)));
        assert_eq!(g.name, "AMD Radeon RX 7900 XTX");
        assert!(g.supported && !g.integrated && g.why_not.is_none());
        assert_eq!(r.select(None).unwrap().unwrap().index, 0);
        assert_eq!(g.summary(), "GPU 0: AMD Radeon RX 7900 XTX (gfx1100), 96 CUs, 24.0 GiB VRAM");
        assert_eq!(g.rocr_visible_devices(), "0");
    }

    #[test]
    fn xt_plus_igpu_picks_the_discrete_card_and_gpu_n_is_checked() {
        let mut t = FakeSysfs::new("xt-igpu");
        // The iGPU first in node order: the pick must not depend on order.
        t.gpu(100306, 4, 0x164e, 128, 512 << 20, None);
        t.gpu(110000, 168, 0x744c, 129, 20 << 30, Some("AMD Radeon RX 7900 XT"));
        let r = discover(&t.root, &archs()).unwrap();
        assert_eq!(r.gpus.len(), 2);
        let igpu = &r.gpus[0];
        assert_eq!(
            (igpu.arch.as_str(), igpu.compute_units, igpu.integrated, igpu.supported),
            ("gfx1036", 2, true, false)
        );
        assert_eq!(igpu.name, "AMD GPU [1002:164e]");
        let why = igpu.why_not.as_deref().unwrap();
        assert!(why.contains("integrated GPU") && why.contains("no code objects for gfx1036"), "{why}");
        let xt = &r.gpus[1];
        assert_eq!(
            (xt.arch.as_str(), xt.compute_units, xt.vram_bytes, xt.supported),
            ("gfx1100", 84, Some(20 << 30), true)
        );
        assert_eq!(r.select(None).unwrap().unwrap().index, 1);
        assert_eq!(r.select(Some(1)).unwrap().unwrap().index, 1);
        let e = r.select(Some(0)).unwrap_err();
        assert!(e.contains("--gpu 0") && e.contains("integrated GPU"), "{e}");
        let e = r.select(Some(2)).unwrap_err();
        assert!(e.contains("there are 2 AMD GPUs (0..=1)"), "{e}");
    }

    #[test]
    fn largest_supported_card_wins_ties_to_the_lower_index() {
        let mut t = FakeSysfs::new("two");
        t.gpu(110001, 120, 0x747e, 128, 16 << 30, None);
        t.gpu(110000, 192, 0x744c, 129, 24 << 30, None);
        t.gpu(110000, 192, 0x744c, 130, 24 << 30, None);
        let r = discover(&t.root, &archs()).unwrap();
        assert_eq!(r.gpus[0].arch, "gfx1101");
        assert_eq!(r.select(None).unwrap().unwrap().index, 1);
    }

    #[test]
    fn only_an_igpu_selects_nothing() {
        let mut t = FakeSysfs::new("igpu");
        t.gpu(110003, 24, 0x15bf, 128, 512 << 20, None); // Phoenix 780M: gfx1103
        let r = discover(&t.root, &archs()).unwrap();
        assert_eq!(r.gpus.len(), 1);
        assert!(r.gpus[0].integrated && !r.gpus[0].supported);
        assert!(r.select(None).unwrap().is_none());
    }

    #[test]
    fn small_vram_marks_an_otherwise_supported_arch_integrated() {
        let (integrated, why) = judge("gfx1100", Some(1 << 30), &archs());
        assert!(integrated && why.unwrap().contains("1.0 GiB VRAM < the 2.0 GiB minimum"));
        let (integrated, why) = judge("gfx1100", None, &archs());
        assert!(!integrated && why.is_none(), "unknown VRAM is not a reason");
    }

    #[test]
    fn unsupported_arch_is_listed_with_the_reason() {
        let mut t = FakeSysfs::new("mi210");
        t.gpu(90010, 416, 0x740f, 128, 64 << 30, Some("AMD Instinct MI210"));
        t.gpu(100300, 144, 0x73bf, 129, 16 << 30, None);
        let r = discover(&t.root, &archs()).unwrap();
        assert_eq!(r.gpus.iter().map(|g| g.arch.as_str()).collect::<Vec<_>>(), ["gfx90a", "gfx1030"]);
        for g in &r.gpus {
            assert!(!g.integrated && !g.supported);
            assert!(g.why_not.as_deref().unwrap().contains(&format!("no code objects for {}", g.arch)));
        }
        assert!(r.select(None).unwrap().is_none());
    }

    #[test]
    fn no_kfd_is_not_an_error() {
        let root = std::env::temp_dir().join(format!("strata-kfd-none-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let r = discover(&root, &archs()).unwrap();
        assert!(!r.present && r.gpus.is_empty());
        assert!(r.select(None).unwrap().is_none());
        assert!(r.select(Some(0)).unwrap_err().contains("no AMD GPU"));
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn driver_version_and_kernel_are_read_when_present() {
        let t = FakeSysfs::new("driver");
        std::fs::create_dir_all(t.root.join("sys/module/amdgpu")).unwrap();
        std::fs::write(t.root.join("sys/module/amdgpu/version"), "6.8.5\n").unwrap();
        std::fs::create_dir_all(t.root.join("proc/sys/kernel")).unwrap();
        std::fs::write(t.root.join("proc/sys/kernel/osrelease"), "6.8.0-45-generic\n").unwrap();
        let r = discover(&t.root, &archs()).unwrap();
        assert_eq!(r.driver_version.as_deref(), Some("6.8.5"));
        assert_eq!(r.kernel.as_deref(), Some("6.8.0-45-generic"));
    }

    #[test]
    fn malformed_files_are_precise_errors() {
        let mut t = FakeSysfs::new("bad");
        let n = t.node("simd_count 192\ngfx_target_version 11oooo\n");
        let e = discover(&t.root, &archs()).unwrap_err().to_string();
        assert!(
            e.contains(&format!("nodes/{n}/properties: line 2")) && e.contains("\"11oooo\" is not an unsigned integer"),
            "{e}"
        );

        let mut t = FakeSysfs::new("bad2");
        t.node("simd_count 192 extra\n");
        let e = discover(&t.root, &archs()).unwrap_err().to_string();
        assert!(e.contains("line 1: expected `key value`"), "{e}");

        let mut t = FakeSysfs::new("bad3");
        let n = t.node("simd_count 192\n");
        let e = discover(&t.root, &archs()).unwrap_err().to_string();
        assert!(e.contains(&format!("nodes/{n}/properties: no `gfx_target_version` line")), "{e}");

        let mut t = FakeSysfs::new("bad4");
        t.gpu(110000, 192, 0x744c, 128, 0, None);
        std::fs::write(t.root.join("sys/class/drm/renderD128/device/mem_info_vram_total"), "lots\n").unwrap();
        let e = discover(&t.root, &archs()).unwrap_err().to_string();
        assert!(
            e.contains("renderD128/device/mem_info_vram_total: line 1: \"lots\" is not an unsigned integer"),
            "{e}"
        );

        let mut t = FakeSysfs::new("bad5");
        let n = t.node("simd_count 4\ngfx_target_version 110000\n");
        let e = discover(&t.root, &archs()).unwrap_err().to_string();
        assert!(e.contains(&format!("nodes/{n}/properties: no `simd_per_cu` line")), "{e}");
    }

    #[test]
    fn missing_drm_device_leaves_vram_unknown() {
        let mut t = FakeSysfs::new("nodrm");
        t.node("simd_count 192\nsimd_per_cu 2\ngfx_target_version 110000\nvendor_id 4098\ndevice_id 29772\ndrm_render_minor 200\nunique_id 1234605616436508552\n");
        let r = discover(&t.root, &archs()).unwrap();
        let g = &r.gpus[0];
        assert_eq!((g.vram_bytes, g.supported, g.name.as_str()), (None, true, "AMD GPU [1002:744c]"));
        assert_eq!(g.rocr_visible_devices(), "GPU-1122334455667788");
        assert!(g.summary().contains("VRAM unknown"));
    }
}
