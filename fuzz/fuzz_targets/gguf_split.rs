//! Split GGUF sets: the input is cut into 1 to 3 fuzzed shards, written as
//! `m-0000K-of-0000N.gguf` to a private temporary directory, and the set is opened by name
//! (`GgufFile::open`, every shard mapped) and checked (`gguf::inspect`). Flags in the first
//! byte leave the last shard out (missing file) or add a stray shard of another split
//! (`m-00001-of-00004.gguf`). Neither reader may panic; a set `inspect` finds clean must open
//! (its split rules are the stricter ones); an opened set's tensor data stays in bounds.
//!
//! Input: `[flags] ([u32 LE length] [shard bytes])* [last shard bytes]`; flags bits 0-1 + 1 =
//! shard count (4 counts as 3), bit 2 = omit the last shard, bit 3 = stray shard (a copy of
//! shard 1), bit 4 = open shard 2 by name instead of shard 1.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

static DIR: OnceLock<PathBuf> = OnceLock::new();

fn dir() -> &'static PathBuf {
    DIR.get_or_init(|| {
        let base =
            if std::path::Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        let d = base.join(format!("strata-fuzz-split-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("temporary directory");
        // libFuzzer ends with exit(): remove the directory then.
        unsafe extern "C" {
            fn atexit(f: extern "C" fn()) -> i32;
        }
        extern "C" fn cleanup() {
            if let Some(d) = DIR.get() {
                let _ = std::fs::remove_dir_all(d);
            }
        }
        // SAFETY: registers a plain function with the C runtime; it only touches the static.
        unsafe { atexit(cleanup) };
        d
    })
}

fn take<'a>(data: &mut &'a [u8]) -> &'a [u8] {
    let Some((len, rest)) = data.split_first_chunk::<4>() else {
        return std::mem::take(data);
    };
    let n = (u32::from_le_bytes(*len) as usize).min(rest.len());
    let (shard, rest) = rest.split_at(n);
    *data = rest;
    shard
}

fuzz_target!(|input: &[u8]| {
    let Some((&flags, mut data)) = input.split_first() else { return };
    let n = ((flags & 3) + 1).min(3) as u32;
    let d = dir();
    let prefix = d.join("m").to_string_lossy().into_owned();
    // Files of earlier inputs must not leak into this one.
    for count in 1..=4 {
        for no in 1..=count {
            let _ = std::fs::remove_file(gguf::split_path(&prefix, no, count));
        }
    }
    let mut paths = Vec::new();
    for i in 1..=n {
        let bytes = if i < n { take(&mut data) } else { data };
        let p = gguf::split_path(&prefix, i, n);
        if !(i == n && flags & 4 != 0 && n > 1) {
            std::fs::write(&p, bytes).expect("writing a shard");
        }
        paths.push((p, bytes));
    }
    if flags & 8 != 0 {
        std::fs::write(gguf::split_path(&prefix, 1, 4), paths[0].1).expect("writing the stray shard");
    }
    let named = if flags & 16 != 0 && n > 1 { &paths[1].0 } else { &paths[0].0 };
    assert_eq!(gguf::split_prefix(named).as_deref(), Some(prefix.as_str()));

    let report = gguf::inspect(named);
    let problems: Vec<String> = report.all_problems().map(|p| format!("{} {p}", p.kind())).collect();
    let _ = report.tensors().count();
    assert_eq!(report.files.len(), if n > 1 { n as usize } else { 1 });
    match GgufFile::open(named) {
        Ok(g) => {
            assert_eq!(g.paths().len(), report.files.len());
            for t in g.tensors() {
                assert_eq!(g.tensor_data(t).len(), t.n_bytes, "tensor {:?} of shard {}", t.name, t.file_index);
                assert!(g.data_offset(t.file_index).is_some());
            }
            let _ = g.metadata().iter().map(|(k, v)| (k.len(), v.to_string())).count();
        }
        Err(e) => {
            let _ = (e.to_string(), e.kind(), e.path());
            assert!(!problems.is_empty(), "GgufFile::open refused ({e}) a set inspect found clean");
        }
    }
});
