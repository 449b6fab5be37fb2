//! `setup.sh` GPU detection and the ROCm-wheel route, run for real on fake machines: fake KFD
//! sysfs trees (`STRATA_SYSFS_ROOT`) and a local stand-in of AMD's wheel index (PEP 503 pages
//! and small wheels served by `python3 -m http.server` on loopback). setup.sh runs in its
//! `--detect-only` / `--rocm-only` modes with this test binary's `strata` (`STRATA_SETUP_BIN`),
//! so nothing is built and the checkout's `.venv` is never touched (`STRATA_VENV`).
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// A temp directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        let p = std::env::temp_dir().join(format!("strata-setup-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fake `/sys` (KFD topology + DRM render nodes), CPU node 0 included.
struct FakeSysfs {
    dir: TempDir,
    nodes: u32,
}

impl FakeSysfs {
    fn new(tag: &str) -> Self {
        let mut s = FakeSysfs { dir: TempDir::new(tag), nodes: 0 };
        s.node("cpu_cores_count 16\nsimd_count 0\ngfx_target_version 0\nvendor_id 0\ndevice_id 0\n");
        s
    }
    fn root(&self) -> &Path {
        &self.dir.0
    }
    fn node(&mut self, props: &str) {
        let d = self.root().join(format!("sys/class/kfd/kfd/topology/nodes/{}", self.nodes));
        self.nodes += 1;
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("properties"), props).unwrap();
    }
    /// A GPU node with `simds` SIMDs (2 per CU) and its render node's VRAM and name.
    fn gpu(mut self, gfx: u32, simds: u32, device_id: u32, vram: u64, name: Option<&str>) -> Self {
        let minor = 127 + self.nodes;
        self.node(&format!(
            "cpu_cores_count 0\nsimd_count {simds}\nmax_waves_per_simd 16\nwave_front_size 32\narray_count 12\n\
             cu_per_simd_array 8\nsimd_per_cu 2\ngfx_target_version {gfx}\nvendor_id 4098\ndevice_id {device_id}\n\
             drm_render_minor {minor}\nunique_id 0\n"
        ));
        let dev = self.root().join(format!("sys/class/drm/renderD{minor}/device"));
        std::fs::create_dir_all(&dev).unwrap();
        std::fs::write(dev.join("mem_info_vram_total"), format!("{vram}\n")).unwrap();
        if let Some(n) = name {
            std::fs::write(dev.join("product_name"), format!("{n}\n")).unwrap();
        }
        self
    }
}

const GIB: u64 = 1 << 30;

fn xtx(tag: &str) -> FakeSysfs {
    FakeSysfs::new(tag).gpu(110000, 192, 0x744c, 24 * GIB, Some("AMD Radeon RX 7900 XTX"))
}

/// Runs setup.sh with `args` on the fake tree; (success, stdout + stderr).
fn setup(root: &Path, args: &[&str], env: &[(&str, &Path)]) -> (bool, String) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cmd = Command::new(repo.join("setup.sh"));
    cmd.args(args)
        .env("STRATA_SETUP_BIN", env!("CARGO_BIN_EXE_strata"))
        .env("STRATA_SYSFS_ROOT", root)
        .env_remove("ROCM_PATH")
        .env_remove("STRATA_ROCM_INDEX")
        .env_remove("STRATA_ROCM_VERSION");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("running setup.sh");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn assert_has(text: &str, needles: &[&str]) {
    for n in needles {
        assert!(text.contains(n), "setup.sh output lacks {n:?}:\n{text}");
    }
}

#[test]
fn setup_detect_one_7900_xtx_picks_hip() {
    let t = xtx("xtx");
    let (ok, out) = setup(t.root(), &["--detect-only"], &[]);
    assert!(ok, "{out}");
    assert_has(
        &out,
        &[
            "GPU 0: AMD Radeon RX 7900 XTX (gfx1100), 96 CUs, 24.0 GiB VRAM, KFD node 1: supported  <- selected",
            "==> detected: hip (GPU 0: AMD Radeon RX 7900 XTX, gfx1100)",
            "==> backend: hip",
        ],
    );
}

#[test]
fn setup_detect_7900_xt_plus_igpu_picks_the_discrete_card() {
    // The iGPU comes first in node order (as on Raphael desktops).
    let t = FakeSysfs::new("xt-igpu").gpu(100306, 4, 0x164e, 512 << 20, None).gpu(
        110000,
        168,
        0x744c,
        20 * GIB,
        Some("AMD Radeon RX 7900 XT"),
    );
    let (ok, out) = setup(t.root(), &["--detect-only"], &[]);
    assert!(ok, "{out}");
    assert_has(
        &out,
        &[
            "GPU 0: AMD GPU [1002:164e] (gfx1036), 2 CUs, 512 MiB VRAM, KFD node 1: not supported: integrated GPU",
            "GPU 1: AMD Radeon RX 7900 XT (gfx1100), 84 CUs, 20.0 GiB VRAM, KFD node 2: supported  <- selected",
            "==> detected: hip (GPU 1: AMD Radeon RX 7900 XT, gfx1100)",
            "==> backend: hip",
        ],
    );
    let (ok, out) = setup(t.root(), &["--detect-only", "--gpu", "1"], &[]);
    assert!(ok, "{out}");
    assert_has(&out, &["==> detected: hip (GPU 1: AMD Radeon RX 7900 XT, gfx1100)"]);
    let (ok, out) = setup(t.root(), &["--detect-only", "--gpu", "0"], &[]);
    assert!(!ok, "--gpu 0 (the iGPU) must be refused:\n{out}");
    assert_has(&out, &["setup.sh: --gpu 0: GPU 0: AMD GPU [1002:164e] (gfx1036)", "is not supported: integrated GPU"]);
    let (ok, out) = setup(t.root(), &["--detect-only", "--gpu", "2"], &[]);
    assert!(!ok && out.contains("--gpu 2: there are 2 AMD GPUs (0..=1)"), "{out}");
}

#[test]
fn setup_detect_only_an_igpu_picks_cpu() {
    let t = FakeSysfs::new("igpu").gpu(110003, 24, 0x15bf, 512 << 20, Some("AMD Radeon 780M"));
    let (ok, out) = setup(t.root(), &["--detect-only"], &[]);
    assert!(ok, "{out}");
    assert_has(
        &out,
        &[
            "GPU 0: AMD Radeon 780M (gfx1103), 12 CUs, 512 MiB VRAM, KFD node 1: not supported: integrated GPU (gfx1103 is an APU graphics core)",
            "==> detected: cpu: no supported AMD GPU",
            "==> backend: cpu",
        ],
    );
}

#[test]
fn setup_detect_unsupported_arch_picks_cpu() {
    let t = FakeSysfs::new("gfx1030").gpu(100300, 144, 0x73bf, 16 * GIB, Some("AMD Radeon RX 6800 XT"));
    let (ok, out) = setup(t.root(), &["--detect-only"], &[]);
    assert!(ok, "{out}");
    assert_has(
        &out,
        &[
            "GPU 0: AMD Radeon RX 6800 XT (gfx1030), 72 CUs, 16.0 GiB VRAM, KFD node 1: not supported: no code objects for gfx1030",
            "==> backend: cpu",
        ],
    );
    // An explicit --backend hip is honoured (the kernels get built), but detection says why
    // there is no card to set up.
    let (ok, out) = setup(t.root(), &["--detect-only", "--backend", "hip"], &[]);
    assert!(ok, "{out}");
    assert_has(&out, &["==> detected: cpu", "==> backend: hip"]);
    let (ok, out) = setup(t.root(), &["--rocm-only"], &[]);
    assert!(!ok && out.contains("no supported AMD GPU: no ROCm to set up"), "{out}");
}

#[test]
fn setup_detect_no_kfd_picks_cpu() {
    let t = TempDir::new("nokfd");
    let (ok, out) = setup(&t.0, &["--detect-only"], &[]);
    assert!(ok, "{out}");
    assert_has(
        &out,
        &[
            "none (the amdgpu driver is not loaded, or there is no AMD GPU)",
            "==> detected: cpu: no AMD GPU: no KFD topology",
            "==> backend: cpu",
        ],
    );
}

#[test]
fn setup_detect_malformed_sysfs_is_a_precise_error_and_cpu() {
    let mut t = xtx("malformed");
    t.node("simd_count 192\nsimd_per_cu 2\ngfx_target_version 11O000\n");
    let (ok, out) = setup(t.root(), &["--detect-only"], &[]);
    assert!(ok, "{out}");
    assert_has(
        &out,
        &[
            "error: ",
            "sys/class/kfd/kfd/topology/nodes/2/properties: line 3: gfx_target_version value \"11O000\" is not an unsigned integer",
            "==> backend: cpu",
        ],
    );
}

#[test]
fn setup_detect_explicit_cpu_stays_cpu() {
    let t = xtx("xtx-cpu");
    let (ok, out) = setup(t.root(), &["--detect-only", "--backend", "cpu"], &[]);
    assert!(ok, "{out}");
    assert_has(&out, &["==> detected: hip (GPU 0: AMD Radeon RX 7900 XTX, gfx1100)", "==> backend: cpu"]);
}

// ---------------------------------------------------------------- the ROCm wheel route

/// A wheel: dist name, files (path in the wheel → bytes), METADATA lines after Name/Version,
/// an optional entry_points.txt.
struct Wheel<'a> {
    name: &'a str,
    files: Vec<(String, Vec<u8>)>,
    metadata: Vec<String>,
    entry_points: Option<&'a str>,
}

const VERSION: &str = "7.13.0";

/// Writes `files/<wheel>` and its PEP 503 page `simple/<name>/index.html`; returns the size.
fn publish(index: &Path, w: &Wheel) -> u64 {
    let stem = w.name.replace('-', "_").to_lowercase();
    let file = format!("{stem}-{VERSION}-py3-none-any.whl");
    let info = format!("{stem}-{VERSION}.dist-info");
    let mut entries = w.files.clone();
    let mut meta = format!("Metadata-Version: 2.1\nName: {}\nVersion: {VERSION}\n", w.name);
    for l in &w.metadata {
        meta.push_str(l);
        meta.push('\n');
    }
    entries.push((format!("{info}/METADATA"), meta.into_bytes()));
    entries.push((
        format!("{info}/WHEEL"),
        b"Wheel-Version: 1.0\nGenerator: strata-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n".to_vec(),
    ));
    if let Some(ep) = w.entry_points {
        entries.push((format!("{info}/entry_points.txt"), ep.as_bytes().to_vec()));
    }
    let mut record: String = entries.iter().map(|(p, _)| format!("{p},,\n")).collect();
    record.push_str(&format!("{info}/RECORD,,\n"));
    entries.push((format!("{info}/RECORD"), record.into_bytes()));

    std::fs::create_dir_all(index.join("files")).unwrap();
    let path = index.join("files").join(&file);
    let mut z = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    let opts = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .unix_permissions(0o755);
    for (p, bytes) in &entries {
        z.start_file(p.as_str(), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.finish().unwrap();

    let project = w.name.to_lowercase().replace('_', "-");
    let page = index.join("simple").join(&project);
    std::fs::create_dir_all(&page).unwrap();
    std::fs::write(
        page.join("index.html"),
        format!("<!DOCTYPE html><html><body><a href=\"../../files/{file}\">{file}</a></body></html>\n"),
    )
    .unwrap();
    std::fs::metadata(&path).unwrap().len()
}

/// `python3 -m http.server` on a free loopback port, killed on drop.
struct Server(Child, u16);

impl Server {
    fn start(dir: &Path) -> Option<Server> {
        let mut child = Command::new("python3")
            .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "--directory"])
            .arg(dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take()?).read_line(&mut line).ok()?;
        // "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        let port = line.split(" port ").nth(1)?.split_whitespace().next()?.parse().ok()?;
        Some(Server(child, port))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stand-ins for the two libraries the engine opens: the gfx1100 HIP runtime of the device
/// tests and a four-function hipBLAS (gcc; None without it or without `--features gpu`).
fn stand_in_libraries(dir: &Path) -> Option<(Vec<u8>, Vec<u8>)> {
    if !cfg!(feature = "gpu") {
        return None;
    }
    let hip = crate::support::fake_hip("setup-wheel", &[])?;
    let src = dir.join("fake_hipblas.c");
    std::fs::write(
        &src,
        "int hipblasCreate(void **h) { *h = (void *)0x10; return 0; }\nint hipblasDestroy(void *h) { return 0; }\n\
         int hipblasSetStream(void *h, void *s) { return 0; }\nint hipblasGemmStridedBatchedEx(void) { return 0; }\n",
    )
    .ok()?;
    let so = dir.join("libhipblas.so.3");
    let ok = Command::new("gcc").args(["-shared", "-fPIC", "-o"]).arg(&so).arg(&src).status().ok()?.success();
    if !ok {
        return None;
    }
    Some((std::fs::read(hip.join("libamdhip64.so")).ok()?, std::fs::read(&so).ok()?))
}

#[test]
fn setup_rocm_wheels_from_a_stand_in_index() {
    if Path::new("/opt/rocm").exists() {
        eprintln!("skipping: /opt/rocm exists, setup.sh would use it instead of installing wheels");
        return;
    }
    let t = xtx("wheels");
    let work = TempDir::new("wheels-index");
    let index = work.0.join("index");
    let libs = stand_in_libraries(&work.0);
    let real_libs = libs.is_some();
    let (hip, blas) =
        libs.unwrap_or_else(|| (b"not a library (stand-in wheel)".to_vec(), b"not a library either".to_vec()));
    let py = |s: &str| s.as_bytes().to_vec();
    let req = |n: &str, extra: Option<&str>| match extra {
        Some(e) => format!("Requires-Dist: {n}=={VERSION}; extra == \"{e}\""),
        None => format!("Requires-Dist: {n}=={VERSION}"),
    };
    let rocm_sdk_main = "import pathlib, sys\n\ndef main():\n    a = sys.argv[1:]\n    if a[:2] == ['path', '--root']:\n        \
                         print(pathlib.Path(__file__).resolve().parent.parent / '_rocm_sdk_devel')\n    elif a[:1] != ['init']:\n        \
                         sys.exit('stand-in rocm-sdk: ' + ' '.join(a))\n";
    let wheels = [
        Wheel {
            name: "rocm",
            files: vec![("rocm_sdk/__init__.py".into(), vec![]), ("rocm_sdk/__main__.py".into(), py(rocm_sdk_main))],
            metadata: vec![
                "Provides-Extra: libraries".into(),
                "Provides-Extra: devel".into(),
                req("rocm-sdk-core", None),
                req("rocm-sdk-libraries-gfx110X-all", Some("libraries")),
                req("rocm-sdk-devel", Some("devel")),
            ],
            entry_points: Some("[console_scripts]\nrocm-sdk = rocm_sdk.__main__:main\n"),
        },
        Wheel {
            name: "rocm-sdk-core",
            files: vec![
                ("_rocm_sdk_core/__init__.py".into(), vec![]),
                ("_rocm_sdk_core/lib/libamdhip64.so.7".into(), hip),
            ],
            metadata: vec![],
            entry_points: None,
        },
        Wheel {
            name: "rocm-sdk-libraries-gfx110X-all",
            files: vec![
                ("_rocm_sdk_libraries_gfx110X_all/__init__.py".into(), vec![]),
                ("_rocm_sdk_libraries_gfx110X_all/lib/libhipblas.so.3".into(), blas),
            ],
            metadata: vec![],
            entry_points: None,
        },
        Wheel {
            name: "rocm-sdk-devel",
            files: vec![
                ("_rocm_sdk_devel/__init__.py".into(), vec![]),
                ("_rocm_sdk_devel/include/hip/hip_runtime.h".into(), py("/* stand-in */\n")),
            ],
            metadata: vec![],
            entry_points: None,
        },
    ];
    let total: u64 = wheels.iter().map(|w| publish(&index, w)).sum();
    let Some(server) = Server::start(&index) else {
        eprintln!("skipping: python3 -m http.server could not be started");
        return;
    };
    let venv = work.0.join("venv");
    let url = format!("http://127.0.0.1:{}/simple/", server.1);
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(repo.join("setup.sh"))
        .arg("--rocm-only")
        .env("STRATA_SETUP_BIN", env!("CARGO_BIN_EXE_strata"))
        .env("STRATA_SYSFS_ROOT", t.root())
        .env("STRATA_VENV", &venv)
        .env("STRATA_ROCM_INDEX", &url)
        .env("STRATA_ROCM_VERSION", VERSION)
        .env("PIP_NO_CACHE_DIR", "1")
        .env_remove("PIP_FIND_LINKS")
        .env_remove("ROCM_PATH")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    drop(server);
    eprintln!("setup.sh --rocm-only:\n{text}");

    // The size is announced before the download, from the index's Content-Length headers.
    assert_has(
        &text,
        &[
            &format!("==> resolving rocm[libraries,devel]=={VERSION} from {url}"),
            &format!("==> ROCm {VERSION} wheels: 4 files, "),
            &format!("({total} bytes) into {}", venv.display()),
        ],
    );
    let site = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())
        .unwrap();
    let core = site.join("_rocm_sdk_core/lib/libamdhip64.so.7");
    let blas = site.join("_rocm_sdk_libraries_gfx110X_all/lib/libhipblas.so.3");
    assert!(core.is_file() && blas.is_file(), "the wheels' libraries are not in {}:\n{text}", site.display());
    assert!(venv.join("bin/rocm-sdk").is_file(), "{text}");

    let built_gpu = cfg!(feature = "gpu");
    if built_gpu && real_libs {
        // The engine opened the stand-in runtime and hipBLAS from the venv.
        assert!(out.status.success(), "{text}");
        let devel = site.join("_rocm_sdk_devel");
        assert_has(
            &text,
            &[
                "system library path: ",
                &format!("ROCm wheels in {}: HIP runtime 6.4.43483 at {}", venv.display(), core.display()),
                "opens GPU 0: Fake Radeon RX 7900 XTX (gfx1100:sramecc-:xnack-)",
                &format!("hipBLAS: hipBLAS 3.x, hipblasGemmStridedBatchedEx at {}", blas.display()),
                "hipBLASLt: not loaded (optional)",
                "==> ROCm ready",
                &format!("export ROCM_PATH={}", devel.display()),
                &format!(
                    "export LD_LIBRARY_PATH={}:{}",
                    core.parent().unwrap().display(),
                    blas.parent().unwrap().display()
                ),
                "export ROCR_VISIBLE_DEVICES=0",
                "export STRATA_HIP_DEVICE=0",
            ],
        );
    } else if built_gpu {
        // No gcc: the wheels hold placeholder bytes, which the loader cannot open.
        assert!(!out.status.success(), "{text}");
        assert_has(&text, &["do not open the card"]);
    } else {
        assert!(out.status.success(), "{text}");
        assert_has(&text, &["libamdhip64 and libhipblas present in", "(not opened: CPU build)", "==> ROCm ready"]);
    }
}

#[test]
fn setup_start_script_exports_the_rocm_environment() {
    // hip_write_start of scripts/setup-hip.sh with the values hip_detect / hip_find_rocm set,
    // and a stand-in `strata` that prints what it receives.
    let t = TempDir::new("start-script");
    let fake_bin = t.0.join("fake-strata");
    std::fs::write(&fake_bin, "#!/bin/sh\necho \"ROCM_PATH=$ROCM_PATH\"\necho \"LD_LIBRARY_PATH=$LD_LIBRARY_PATH\"\n\
                               echo \"ROCR_VISIBLE_DEVICES=$ROCR_VISIBLE_DEVICES\"\necho \"STRATA_HIP_DEVICE=$STRATA_HIP_DEVICE\"\necho \"args=$*\"\n")
        .unwrap();
    Command::new("chmod").arg("+x").arg(&fake_bin).status().unwrap();
    let helper = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/setup-hip.sh");
    let script = format!(
        ". '{}'; det_name='AMD Radeon RX 7900 XTX' det_arch=gfx1100; rocm_root='/opt/my rocm' rocm_ld=/w/core/lib:/w/libs/lib \
         hip_rocr=GPU-1122334455667788 hip_device=0; hip_write_start /models/m.gguf '{}' 9001",
        helper.display(),
        fake_bin.display()
    );
    let out = Command::new("bash").arg("-euc").arg(&script).current_dir(&t.0).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cfg = server::ServerConfig::from_file(&t.0.join("strata-server.json")).expect("a valid server config");
    assert_eq!(cfg.engine.executable.as_deref(), Some(fake_bin.as_path()));
    assert_eq!(cfg.engine.args.as_deref(), Some(&["--device".to_string(), "hip".to_string()][..]));
    assert_eq!((cfg.tokenizer.as_deref(), cfg.port), (Some(Path::new("/models/m.gguf")), Some(9001)));
    let run = Command::new(t.0.join("run-strata.sh"))
        .arg("--port")
        .arg("9002")
        .env("LD_LIBRARY_PATH", "/before")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{text}{}", String::from_utf8_lossy(&run.stderr));
    assert_has(
        &text,
        &[
            "ROCM_PATH=/opt/my rocm\n",
            "LD_LIBRARY_PATH=/w/core/lib:/w/libs/lib:/before\n",
            "ROCR_VISIBLE_DEVICES=GPU-1122334455667788\n",
            "STRATA_HIP_DEVICE=0\n",
            &format!("args=server --config {}/strata-server.json --port 9002\n", t.0.display()),
        ],
    );
}
