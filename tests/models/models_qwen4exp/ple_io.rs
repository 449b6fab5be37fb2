//! PLE table I/O: every read mode (O_DIRECT, mmap, RAM) and cache size gives bit-identical
//! logits; the cache counters add up; the table may come from an explicit `ple_gguf` file; a
//! model without its table refuses to load unless told to skip; refused O_DIRECT falls back to
//! buffered reads with a warning; a table file truncated after load is an error of the
//! forward pass in every file-backed mode (not a SIGBUS through the mapping); the loop the
//! executor passes for a batch's file reads (serial or the CPU's team) changes nothing.
//!
//! The baseline is the default (mmap) load, whose logits the other tests compare with
//! llama.cpp's; here only exact equality across modes is asserted.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use strata::EngineError;
use strata::cpu::prelude::*;
use strata::cpu::qwen4exp::team_for_each;
use strata::model::qwen4exp::ple_io::serial;
use strata::model::qwen4exp::{KvType, ParFor, PleIo, PleOptions, Qwen4Exp};

use super::{load_refs, ref_dir};

const F32: &str = "tiny-qwen4exp-public-f32.gguf";
const Q8: &str = "tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf";

fn tmp_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-q4x-pleio-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Logits of the 64-token reference prompt (seq2, which holds an EOS) from a fresh state.
fn logits(m: &Qwen4Exp) -> Vec<f32> {
    let toks = &load_refs("f32")[1].tokens;
    let mut st = m.new_state(KvType::F16);
    m.forward(&mut st, toks, 0).unwrap()
}

fn n_lookups(m: &Qwen4Exp) -> u64 {
    // One row per PLE head per token.
    (load_refs("f32")[1].tokens.len() * m.ple.as_ref().unwrap().params.n_heads()) as u64
}

/// Distinct table rows the prompt touches: the misses of a pass with a cache that holds all.
fn distinct_rows(path: &Path) -> u64 {
    let m = open(path, PleIo::Mmap, 64 << 20);
    logits(&m);
    let s = m.ple_stats().unwrap();
    assert_eq!(s.evictions, 0);
    s.misses
}

fn open(path: &Path, io: PleIo, cache: usize) -> Qwen4Exp {
    let opt = PleOptions { ple_io: io, ple_cache_bytes: cache, ..PleOptions::default() };
    Qwen4Exp::open_with(path, &opt).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn ple_io_modes_and_cache_sizes_are_bit_identical() {
    for file in [F32, Q8] {
        let path = ref_dir().join(file);
        let base = logits(&Qwen4Exp::open(&path).unwrap());
        for io in [PleIo::Direct, PleIo::Mmap, PleIo::Ram] {
            // No cache, a tiny cache (evictions), a big one.
            for cache in [0usize, 4 << 10, 64 << 20] {
                let m = open(&path, io, cache);
                let t = &m.ple.as_ref().unwrap().table;
                assert_eq!(t.io, io);
                let got = logits(&m);
                assert!(got == base, "{file} {io:?} cache {cache}: logits differ");
                let s = m.ple_stats().unwrap();
                let n = n_lookups(&m);
                eprintln!("{file} {io:?} cache {cache}: {s:?}");
                assert_eq!(s.hits + s.misses, n, "{io:?} {cache}: every lookup counted once");
                assert_eq!(s.capacity_rows, cache / t.row_bytes);
                assert!(s.resident_rows <= s.capacity_rows);
                if cache == 0 {
                    assert_eq!((s.hits, s.misses, s.resident_rows), (0, n, 0));
                } else if s.evictions == 0 {
                    // Every distinct row missed exactly once and stayed.
                    assert_eq!(s.misses as usize, s.resident_rows);
                } else {
                    assert_eq!(s.resident_rows, s.capacity_rows);
                    assert_eq!(s.misses as usize, s.resident_rows + s.evictions as usize);
                }
                if io == PleIo::Direct {
                    assert!(t.direct_active(), "ext4 accepts O_DIRECT: {:?}", t.warnings());
                    // One batch, an empty cache at its start: each distinct row is read once
                    // (in parallel), however small the cache.
                    assert_eq!(s.file_reads, distinct_rows(&path));
                    assert_eq!(s.file_bytes % 4096, 0, "O_DIRECT reads whole aligned pages");
                } else {
                    assert_eq!((s.file_reads, s.file_bytes), (0, 0));
                }
                if cache == 4 << 10 {
                    // A second pass starts with 120 cached rows that get evicted within the
                    // batch and are needed again later in it (the single-row re-read path).
                    assert!(logits(&m) == base, "{file} {io:?}: second pass differs");
                    let s2 = m.ple_stats().unwrap();
                    assert_eq!(s2.hits + s2.misses, 2 * n);
                    if io == PleIo::Direct {
                        assert!(s2.file_reads > s.file_reads);
                    }
                }
                if cache == 64 << 20 {
                    // A second identical pass: every row now hits.
                    let again = logits(&m);
                    assert!(again == base);
                    let s2 = m.ple_stats().unwrap();
                    assert_eq!((s2.hits, s2.misses), (s.hits + n, s.misses));
                    assert_eq!(s2.file_reads, s.file_reads);
                }
            }
        }
    }
}

/// A batch of rows read from the file (`Direct`, no cache) one at a time or on the CPU
/// executor's loop: the same rows, the same counters.
#[test]
fn ple_rows_read_serially_or_in_parallel_are_identical() {
    let path = ref_dir().join(Q8);
    let read = |par: ParFor| {
        let m = open(&path, PleIo::Direct, 0);
        let p = m.ple.as_ref().unwrap();
        let rows = p.row_ids(&load_refs("f32")[1].tokens, &mut p.new_state()).unwrap();
        (p.read_rows(&rows, par).unwrap(), m.ple_stats().unwrap())
    };
    let (serial_rows, serial_stats) = read(serial);
    let (team_rows, team_stats) = read(team_for_each);
    assert!(serial_rows == team_rows, "rows differ");
    assert_eq!(serial_stats, team_stats);
    assert!(serial_stats.file_reads > 0);
}

/// The q8_0 split model rewritten as a trunk file without the table plus a separate table file.
fn trunk_and_table() -> (PathBuf, PathBuf) {
    let g = gguf::GgufFile::open(&ref_dir().join(Q8)).unwrap();
    let d = tmp_dir();
    let (trunk, table) = (d.join("trunk.gguf"), d.join("ple-table.gguf"));
    let mut wt = gguf::GgufWriter::new();
    let mut wp = gguf::GgufWriter::new();
    for (k, v) in g.metadata() {
        if !k.starts_with("split.") {
            wt.add_metadata(k.clone(), v.clone());
        }
    }
    wp.add_metadata("general.architecture", gguf::Value::Str("qwen4exp".into()));
    for t in g.tensors() {
        let w = if t.name == "per_layer_token_embd.weight" { &mut wp } else { &mut wt };
        w.add_tensor(t.name.clone(), &t.dims, t.ty, g.tensor_data(t).to_vec());
    }
    wt.write(&trunk).unwrap();
    wp.write(&table).unwrap();
    (trunk, table)
}

#[test]
fn ple_table_from_explicit_file_missing_table_and_skip() {
    let base = logits(&Qwen4Exp::open(&ref_dir().join(Q8)).unwrap());
    let (trunk, table) = trunk_and_table();
    for io in [PleIo::Direct, PleIo::Mmap, PleIo::Ram] {
        let opt = PleOptions { ple_gguf: Some(table.clone()), ple_io: io, ..PleOptions::default() };
        let m = Qwen4Exp::open_with(&trunk, &opt).unwrap();
        assert!(logits(&m) == base, "explicit ple_gguf {io:?}: logits differ");
        assert!(m.warnings.is_empty(), "{:?}", m.warnings);
    }

    // No table anywhere: a typed error naming the searched file and the options.
    let err = Qwen4Exp::open(&trunk).err().expect("a model without its PLE table must not load");
    assert!(matches!(&err, EngineError::PleTableMissing { searched } if searched == &vec![trunk.clone()]), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("per_layer_token_embd.weight") && msg.contains("--ple-gguf") && msg.contains("--ple-skip"),
        "{msg}"
    );
    // An explicit file that lacks the table is the same error, naming that file.
    let opt = PleOptions { ple_gguf: Some(trunk.clone()), ..PleOptions::default() };
    assert!(matches!(Qwen4Exp::open_with(&trunk, &opt), Err(EngineError::PleTableMissing { .. })));
    // An explicit file that does not exist: the GGUF error names it.
    let opt = PleOptions { ple_gguf: Some(tmp_dir().join("nope.gguf")), ..PleOptions::default() };
    let err = Qwen4Exp::open_with(&trunk, &opt).err().unwrap();
    assert!(err.to_string().contains("nope.gguf"), "{err}");

    // Skip: loads, warns, the block adds nothing (no PLE state), logits finite and different.
    let opt = PleOptions { ple_skip: true, ..PleOptions::default() };
    let m = Qwen4Exp::open_with(&trunk, &opt).unwrap();
    assert!(m.ple.is_none() && m.ple_stats().is_none());
    assert_eq!(m.warnings.len(), 1);
    assert!(m.warnings[0].contains("skipped"), "{:?}", m.warnings);
    let st = m.new_state(KvType::F16);
    assert!(st.ple.is_none());
    let got = logits(&m);
    assert!(got.iter().all(|v| v.is_finite()));
    assert!(got != base, "skipping the PLE block must change the logits");
    // With the table present, ple_skip changes nothing.
    let m = Qwen4Exp::open_with(&ref_dir().join(Q8), &opt).unwrap();
    assert!(logits(&m) == base && m.warnings.is_empty());
}

/// O_DIRECT refused (simulated, and for real on tmpfs if this kernel's tmpfs refuses it):
/// buffered reads, a warning, identical logits.
#[test]
fn ple_direct_io_falls_back_to_buffered_reads() {
    let path = ref_dir().join(F32);
    let base = logits(&Qwen4Exp::open(&path).unwrap());
    let opt = PleOptions {
        ple_io: PleIo::Direct,
        ple_cache_bytes: 0,
        simulate_direct_refusal: true,
        ..PleOptions::default()
    };
    let m = Qwen4Exp::open_with(&path, &opt).unwrap();
    let t = &m.ple.as_ref().unwrap().table;
    assert!(!t.direct_active());
    assert_eq!(m.warnings.len(), 1);
    assert!(m.warnings[0].contains("O_DIRECT"), "{:?}", m.warnings);
    assert!(logits(&m) == base);
    let s = m.ple_stats().unwrap();
    // Buffered reads transfer exactly one row each, each distinct row once per batch.
    assert_eq!(s.misses, n_lookups(&m));
    assert_eq!(s.file_reads, distinct_rows(&path));
    assert_eq!(s.file_bytes, s.file_reads * t.row_bytes as u64);

    // tmpfs: accepted since Linux 6.6, refused before; either way the logits are identical.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let p = shm.join(format!("strata-q4x-{}.gguf", std::process::id()));
        std::fs::copy(&path, &p).unwrap();
        let opt = PleOptions { ple_io: PleIo::Direct, ..PleOptions::default() };
        let m = Qwen4Exp::open_with(&p, &opt).unwrap();
        let direct = m.ple.as_ref().unwrap().table.direct_active();
        let got = logits(&m);
        let direct_after = m.ple.as_ref().unwrap().table.direct_active();
        eprintln!(
            "tmpfs O_DIRECT: open {direct}, after reads {direct_after}, warnings {:?}",
            m.ple.as_ref().unwrap().table.warnings()
        );
        let _ = std::fs::remove_file(&p);
        assert!(got == base);
        if !direct_after {
            assert!(!m.ple.as_ref().unwrap().table.warnings().is_empty());
        }
    }
}

/// A table file truncated under a loaded model (the q8_0 split fixture, whose second shard
/// holds only the table): the next forward pass is an error naming the file, the row, its
/// offset and the file's length, in the default `Mmap` mode (where a read through the mapping
/// past the new end would be a SIGBUS that kills the process) as in `Direct` mode (a short
/// read); once the file is whole again the same model gives the same logits as before.
#[test]
fn ple_table_truncated_after_load_is_an_error_not_sigbus() {
    let base = logits(&Qwen4Exp::open(&ref_dir().join(Q8)).unwrap());
    let shard2 = Q8.replace("00001-of", "00002-of");
    let saved = std::fs::read(ref_dir().join(&shard2)).unwrap();
    for io in [PleIo::Mmap, PleIo::Direct] {
        let d = tmp_dir().join(format!("truncated-{io:?}"));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(ref_dir().join(Q8), d.join(Q8)).unwrap();
        let table = d.join(&shard2);
        std::fs::write(&table, &saved).unwrap();
        // No row cache: every token reads the table.
        let m = open(&d.join(Q8), io, 0);
        assert!(logits(&m) == base, "{io:?}: intact copy");

        let f = std::fs::OpenOptions::new().write(true).open(&table).unwrap();
        f.set_len(4096).unwrap();
        let toks = &load_refs("f32")[1].tokens;
        let err = m
            .forward(&mut m.new_state(KvType::F16), toks, 0)
            .err()
            .unwrap_or_else(|| panic!("{io:?}: a truncated table must fail the forward pass"));
        let msg = err.to_string();
        eprintln!("{io:?}: {msg}");
        assert!(msg.contains(&shard2) && msg.contains("PLE"), "{io:?}: {msg}");
        if io == PleIo::Mmap {
            assert!(
                msg.contains("PLE row ") && msg.contains(" at byte ") && msg.contains("(4096 bytes now)"),
                "names the row, its offset and the file's length: {msg}"
            );
        }
        // Still usable: the same error again, then whole again, the same logits.
        assert!(m.forward(&mut m.new_state(KvType::F16), toks, 0).is_err());
        f.set_len(0).unwrap();
        f.write_all_at(&saved, 0).unwrap();
        drop(f);
        assert!(logits(&m) == base, "{io:?}: restored table");
        drop(m);
        let _ = std::fs::remove_dir_all(&d);
    }
}
