//! `gguf::inspect`: one test per kind of defect. Each builds a valid small model with the
//! writer, damages it, and checks that the report names the problem (kind, file, tensor, byte
//! offset), that reading went on wherever the layout still allows it, and that the strict
//! reader refuses the same bytes with the same first error.

use std::path::{Path, PathBuf};

use gguf::{GgufError, GgufFile, GgufWriter, ModelReport, Value, inspect, inspect_bytes};
use quant::GgmlType;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-gguf-check-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// f32 matrix, q8_0 matrix (2 blocks per row), q4_K vector, 1-d f32: data at relative offsets
/// 0, 64, 224, 384 (32-byte alignment).
fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::Str("testarch".into()));
    w.add_metadata("t.u32", Value::U32(7));
    w.add_metadata("t.bool", Value::Bool(true));
    let strs = ["a", "bb", "ccc"].map(|s| Value::Str(s.into()));
    w.add_metadata("t.arr_str", Value::Array(strs.to_vec()));
    w.add_metadata("t.f32", Value::F32(0.5));
    w.add_tensor("tensor_a", &[4, 3], GgmlType::F32, vec![1u8; 48]);
    w.add_tensor("tensor_b", &[64, 2], GgmlType::Q8_0, vec![2u8; 136]);
    w.add_tensor("tensor_c", &[256], GgmlType::Q4K, vec![3u8; 144]);
    w.add_tensor("tensor_d", &[5], GgmlType::F32, vec![4u8; 20]);
    w
}

fn good() -> Vec<u8> {
    sample_writer().to_bytes().unwrap()
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("pattern present")
}

/// Where the key or tensor name `s` starts as a GGUF string (its u64 length prefix).
fn string_at(b: &[u8], s: &str) -> usize {
    find(b, s.as_bytes()) - 8
}

/// Field offsets in the info of a 1- or 2-d tensor: (n_dims, dims, type, offset).
fn info_fields(b: &[u8], name: &str, n_dims: usize) -> (usize, usize, usize, usize) {
    let nd = find(b, name.as_bytes()) + name.len();
    (nd, nd + 4, nd + 4 + 8 * n_dims, nd + 8 + 8 * n_dims)
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn problems(r: &ModelReport) -> Vec<&GgufError> {
    r.all_problems().collect()
}

fn kinds(r: &ModelReport) -> Vec<&'static str> {
    r.all_problems().map(GgufError::kind).collect()
}

/// The report of damaged single-file bytes; also checks the strict reader fails identically.
fn check(b: &[u8]) -> ModelReport {
    let r = inspect_bytes("bad.gguf", b);
    let strict = GgufFile::from_bytes("bad.gguf", b.to_vec());
    match (r.all_problems().next(), strict) {
        (None, Ok(_)) => {}
        (Some(p), Err(e)) => assert_eq!(p.to_string(), e.to_string()),
        (p, s) => panic!("inspect {p:?} but the reader gives {:?}", s.err()),
    }
    r
}

#[test]
fn clean_file_report_matches_the_reader() {
    let b = good();
    let r = check(&b);
    assert!(r.is_clean(), "{:?}", problems(&r));
    let g = GgufFile::from_bytes("bad.gguf", b.clone()).unwrap();
    let f = &r.files[0];
    assert_eq!((f.version, f.tensor_count, f.kv_count), (Some(3), Some(4), Some(5)));
    assert_eq!((f.alignment, f.data_offset, f.len), (32, g.data_offset(0), b.len() as u64));
    assert_eq!(f.metadata, g.metadata());
    assert_eq!(f.tensors.len(), 4);
    for (e, t) in f.tensors.iter().zip(g.tensors()) {
        assert_eq!((&e.name, &e.dims, e.ty, e.offset), (&t.name, &t.dims, Some(t.ty), t.offset));
        assert_eq!(e.n_bytes, Some(t.n_bytes as u64));
        assert_eq!(e.info_offset as usize, string_at(&b, &t.name));
    }
    let offsets: Vec<u64> = f.tensors.iter().map(|t| t.offset).collect();
    assert_eq!(offsets, [0, 64, 224, 384]);
    assert_eq!(f.tensor_bytes(), 48 + 136 + 144 + 20);
    assert!(f.metadata_complete() && f.tensors_complete());
}

#[test]
fn header_defects() {
    let mut b = good();
    b[0] = b'X';
    let r = check(&b);
    assert_eq!(kinds(&r), ["bad_magic"]);
    assert_eq!(r.files[0].version, None);

    let mut b = good();
    put_u32(&mut b, 4, 7);
    assert_eq!(kinds(&check(&b)), ["unsupported_version"]);

    let r = check(&good()[..10]);
    let p = problems(&r);
    assert!(matches!(p[..], [GgufError::Truncated { offset: 8, needed: 8, len: 10, .. }]), "{p:?}");
    assert!(p[0].to_string().contains("bad.gguf") && p[0].to_string().contains("tensor count"));
    assert_eq!(r.files[0].version, Some(3));

    assert_eq!(kinds(&check(&[])), ["truncated"]);

    // An absurd tensor count: the metadata before it is still read.
    let mut b = good();
    put_u64(&mut b, 8, 1 << 60);
    let r = check(&b);
    assert_eq!(kinds(&r), ["count_too_large"]);
    assert!(r.files[0].metadata_complete() && r.files[0].tensors.is_empty());
}

#[test]
fn metadata_truncation_names_the_key() {
    let b = good();
    let value_at = string_at(&b, "t.u32") + 8 + 5 + 4;
    let cut = value_at + 2; // half of the u32
    let r = check(&b[..cut]);
    let p = problems(&r);
    assert!(
        matches!(p[..], [GgufError::Truncated { offset, needed: 4, len, .. }] if *offset == value_at as u64 && *len == cut as u64),
        "{p:?}"
    );
    assert!(p[0].to_string().contains("\"t.u32\""), "{}", p[0]);
    let f = &r.files[0];
    let keys: Vec<&str> = f.metadata.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["general.architecture"]);
    // A string length that cannot fit in what is left is caught before reading it.
    let r = check(&b[..find(&b, b"ccc") + 1]);
    let p = problems(&r);
    assert!(matches!(p[..], [GgufError::CountTooLarge { count: 3, remaining: 1, .. }]), "{p:?}");
    assert!(p[0].to_string().contains("\"t.arr_str\""), "{}", p[0]);
    assert!(!f.metadata_complete() && f.tensors.is_empty() && f.data_offset.is_none());
}

#[test]
fn unreadable_value_stops_the_metadata() {
    let mut b = good();
    let at = string_at(&b, "t.bool") + 8 + 6;
    put_u32(&mut b, at, 13);
    let r = check(&b);
    let p = problems(&r);
    assert!(
        matches!(p[..], [GgufError::UnknownValueType { key, ty: 13, offset, .. }] if key == "t.bool" && *offset == at as u64 + 4),
        "{p:?}"
    );
    assert_eq!(r.files[0].metadata.len(), 2);
}

#[test]
fn duplicate_key_and_bad_alignment_do_not_stop_reading() {
    let mut b = good();
    let at = find(&b, b"t.f32");
    b[at + 2..at + 5].copy_from_slice(b"u32"); // t.f32 -> t.u32
    let r = check(&b);
    let p = problems(&r);
    assert!(
        matches!(p[..], [GgufError::DuplicateKey { key, offset, .. }] if key == "t.u32" && *offset == at as u64 - 8),
        "{p:?}"
    );
    assert_eq!(r.files[0].tensors.len(), 4);

    let mut w = sample_writer();
    w.add_metadata("general.alignment", Value::U32(64));
    let mut b = w.to_bytes().unwrap();
    let key_at = string_at(&b, "general.alignment");
    let at = key_at + 8 + 17 + 4;
    put_u32(&mut b, at, 48);
    let r = check(&b);
    let p = problems(&r);
    // Tensors were laid out for 64: with the default 32 they are still aligned. The error names
    // the key's own offset (it named byte 0 before issue 39).
    assert!(
        matches!(p[..], [GgufError::BadValue { key, offset, .. }] if key == "general.alignment" && *offset == key_at as u64),
        "{p:?}"
    );
    assert_eq!((r.files[0].alignment, r.files[0].tensors.len()), (32, 4));
}

#[test]
fn several_tensor_defects_are_all_reported() {
    let mut b = good();
    let (_, _, ty_b, _) = info_fields(&b, "tensor_b", 2);
    put_u32(&mut b, ty_b, 4); // Q4_2, removed from ggml
    let (_, _, _, off_c) = info_fields(&b, "tensor_c", 1);
    put_u64(&mut b, off_c, 224 + 4);
    let (_, _, ty_d, _) = info_fields(&b, "tensor_d", 1);
    put_u32(&mut b, ty_d, GgmlType::Q8_0 as u32); // 5 values are not a whole q8_0 block
    let r = check(&b);
    let p = problems(&r);
    let info = |n| string_at(&b, n) as u64;
    assert!(
        matches!(p[0], GgufError::UnknownTensorType { tensor, ty: 4, offset, .. } if tensor == "tensor_b" && *offset == info("tensor_b")),
        "{p:?}"
    );
    assert!(
        matches!(p[1], GgufError::Misaligned { tensor, offset, data_offset: 228, alignment: 32, .. } if tensor == "tensor_c" && *offset == info("tensor_c")),
        "{p:?}"
    );
    assert!(
        matches!(p[2], GgufError::BadShape { tensor, offset, .. } if tensor == "tensor_d" && *offset == info("tensor_d")),
        "{p:?}"
    );
    assert!(p[2].to_string().contains("row length 5 is not a multiple of the q8_0 block size 32"), "{}", p[2]);
    assert_eq!(p.len(), 3, "{p:?}");
    let t = &r.files[0].tensors;
    assert_eq!((t[1].type_name(), t[1].n_bytes, t[0].n_bytes), ("unknown(4)".to_string(), None, Some(48)));
    assert!(p[1].to_string().contains(&format!("at byte {}", info("tensor_c"))), "{}", p[1]);
}

#[test]
fn shape_overflow_and_too_many_dims() {
    let mut b = good();
    let (_, dims_b, _, _) = info_fields(&b, "tensor_b", 2);
    put_u64(&mut b, dims_b, 1 << 40);
    put_u64(&mut b, dims_b + 8, 1 << 40);
    let r = check(&b);
    assert_eq!(kinds(&r), ["bad_shape"]);
    assert!(problems(&r)[0].to_string().contains("overflows"));

    // A bad dimension count stops the table: the infos after it cannot be located.
    let mut b = good();
    let (nd_b, _, _, _) = info_fields(&b, "tensor_b", 2);
    put_u32(&mut b, nd_b, 5);
    let r = check(&b);
    assert_eq!(kinds(&r), ["bad_shape"]);
    let f = &r.files[0];
    assert_eq!((f.tensors.len(), f.data_offset), (1, None));
}

#[test]
fn data_outside_the_file() {
    let b = good();
    let data = GgufFile::from_bytes("x", b.clone()).unwrap().data_offset(0).unwrap();
    let end = data as usize + 384 + 20;
    let r = check(&b[..end - 1]);
    let p = problems(&r);
    let (s, e, l) = (data + 384, data + 404, end as u64 - 1);
    assert!(
        matches!(p[..], [GgufError::OutOfRange { tensor, start, end, len, .. }] if tensor == "tensor_d" && (*start, *end, *len) == (s, e, l)),
        "{p:?}"
    );
    assert!(p[0].to_string().contains(&format!("[{s}, {e})")), "{}", p[0]);

    // Offsets far out, and one whose end overflows u64.
    let mut b = good();
    let (_, _, _, off_b) = info_fields(&b, "tensor_b", 2);
    put_u64(&mut b, off_b, 1 << 40);
    let (_, _, _, off_c) = info_fields(&b, "tensor_c", 1);
    put_u64(&mut b, off_c, u64::MAX - 31);
    let r = check(&b);
    assert_eq!(kinds(&r), ["out_of_range", "out_of_range"]);
}

#[test]
fn overlapping_tensors() {
    let mut b = good();
    let data = GgufFile::from_bytes("x", b.clone()).unwrap().data_offset(0).unwrap();
    let (_, _, _, off_d) = info_fields(&b, "tensor_d", 1);
    put_u64(&mut b, off_d, 96); // inside tensor_b [64, 200)
    let (_, _, _, off_b) = info_fields(&b, "tensor_b", 2);
    put_u64(&mut b, off_b, 32); // over the end of tensor_a [0, 48)
    let r = check(&b);
    let p = problems(&r);
    assert!(
        matches!(p[0], GgufError::Overlap { first, second, offset, .. } if first == "tensor_a" && second == "tensor_b" && *offset == data + 32),
        "{p:?}"
    );
    assert!(
        matches!(p[1], GgufError::Overlap { first, second, offset, .. } if first == "tensor_b" && second == "tensor_d" && *offset == data + 96),
        "{p:?}"
    );
    assert_eq!(p.len(), 2);
}

#[test]
fn duplicate_tensor_names() {
    let mut b = good();
    let at = find(&b, b"tensor_c");
    b[at + 7] = b'a';
    let r = check(&b);
    let p = problems(&r);
    assert!(
        matches!(p[..], [GgufError::DuplicateTensor { tensor, offset, .. }] if tensor == "tensor_a" && *offset == at as u64 - 8),
        "{p:?}"
    );
}

#[test]
fn split_models() {
    let d = tmp_dir("split");
    let prefix = d.join("m").to_str().unwrap().to_string();
    let paths = sample_writer().write_split(&prefix, 3).unwrap();
    let r = inspect(&paths[1]);
    assert!(r.is_clean(), "{:?}", problems(&r));
    let counts: Vec<usize> = r.files.iter().map(|f| f.tensors.len()).collect();
    assert_eq!(counts, [1, 1, 2]);
    for (f, p) in r.files.iter().zip(&paths) {
        assert_eq!((&f.path, f.len), (p, std::fs::metadata(p).unwrap().len()));
    }
    assert_eq!(r.tensors().map(|(i, _)| i).collect::<Vec<_>>(), [0, 1, 2, 2]);

    // A shard that is gone.
    let saved = std::fs::read(&paths[2]).unwrap();
    std::fs::remove_file(&paths[2]).unwrap();
    let r = inspect(&paths[0]);
    let p = problems(&r);
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].path(), Some(paths[2].as_path()));
    assert!(p[0].to_string().contains("shard 3 of 3 is missing"), "{}", p[0]);
    std::fs::write(&paths[2], &saved).unwrap();

    // Leftovers of a split into two files under the same prefix.
    let other = sample_writer().write_split(&prefix, 2).unwrap();
    let r = inspect(&paths[0]);
    let p = problems(&r);
    assert_eq!(p.len(), 2, "{p:?}");
    assert_eq!(p[0].path(), Some(other[0].as_path()));
    assert!(p[0].to_string().contains("extra shard: named shard 1 of 2"), "{}", p[0]);
    for o in &other {
        std::fs::remove_file(o).unwrap();
    }
    assert!(inspect(&paths[0]).is_clean());
}

/// Damages shard `i` of a fresh 3-shard split and returns the report of the model.
fn damaged_split(name: &str, i: usize, damage: impl Fn(&mut Vec<u8>)) -> (ModelReport, Vec<PathBuf>) {
    let d = tmp_dir(name);
    let paths = sample_writer().write_split(d.join("m").to_str().unwrap(), 3).unwrap();
    let mut b = std::fs::read(&paths[i]).unwrap();
    damage(&mut b);
    std::fs::write(&paths[i], b).unwrap();
    (inspect(&paths[0]), paths)
}

fn only_problem(r: &ModelReport, path: &Path, text: &str) {
    let p = problems(r);
    assert!(p.len() == 1 && p[0].path() == Some(path) && p[0].to_string().contains(text), "{p:?}");
}

#[test]
fn split_key_defects() {
    // split.no (u16) of the second shard says 2.
    let value = |b: &Vec<u8>, key: &str| string_at(b, key) + 8 + key.len() + 4;
    let (r, p) = damaged_split("no", 1, |b| {
        let at = value(b, "split.no");
        b[at..at + 2].copy_from_slice(&2u16.to_le_bytes());
    });
    only_problem(&r, &p[1], "split.no is 2, expected 1 (0-based) for shard 2 of 3");
    let (r, p) = damaged_split("count", 2, |b| {
        let at = value(b, "split.count");
        b[at..at + 2].copy_from_slice(&4u16.to_le_bytes());
    });
    only_problem(&r, &p[2], "split.count is 4");
    let (r, p) = damaged_split("total", 0, |b| {
        let at = value(b, "split.tensors.count");
        b[at..at + 4].copy_from_slice(&5i32.to_le_bytes());
    });
    only_problem(&r, &p[0], "split.tensors.count is 5 but the shards hold 4 tensors");
    let (r, p) = damaged_split("missing-no", 1, |b| {
        let at = find(b, b"split.no");
        b[at + 7] = b'x';
    });
    only_problem(&r, &p[1], "split.no is missing");
    let (r, p) = damaged_split("missing-count", 0, |b| {
        let at = find(b, b"split.count");
        b[at + 10] = b'x';
    });
    only_problem(&r, &p[0], "split.count is missing");
    // tensor_b of shard 2 renamed to tensor_a, the name of shard 1's tensor.
    let (r, p) = damaged_split("dup", 1, |b| {
        let at = find(b, b"tensor_b");
        b[at + 7] = b'a';
    });
    only_problem(&r, &p[1], "duplicate tensor name \"tensor_a\"");
    assert!(GgufFile::open(&p[0]).is_err());

    // A first shard copied under a plain name still says split.count 3.
    let d = tmp_dir("lone");
    let paths = sample_writer().write_split(d.join("m").to_str().unwrap(), 3).unwrap();
    let lone = d.join("lone.gguf");
    std::fs::copy(&paths[0], &lone).unwrap();
    let r = inspect(&lone);
    let p = problems(&r);
    assert!(
        p[0].to_string().contains("split.count is 3 but the file name does not follow <prefix>-00001-of-00003.gguf"),
        "{p:?}"
    );
    assert!(p[1].to_string().contains("split.tensors.count is 4 but the shards hold 1 tensors"), "{p:?}");
    assert_eq!(p.len(), 2);
}

#[test]
fn missing_file_is_reported_not_raised() {
    let p = Path::new("/nonexistent/dir/x.gguf");
    let r = inspect(p);
    assert_eq!(kinds(&r), ["io"]);
    assert!(problems(&r)[0].to_string().contains("/nonexistent/dir/x.gguf"));
}

#[test]
fn truncation_and_byte_flips_agree_with_the_reader() {
    let b = good();
    let last_end = b.len() - 12; // tensor_d's 20 bytes end 12 bytes before the padded end
    for cut in 0..last_end {
        assert!(!check(&b[..cut]).is_clean(), "cut at {cut}");
    }
    assert!(check(&b[..last_end]).is_clean());
    let header_end = GgufFile::from_bytes("x", b.clone()).unwrap().data_offset(0).unwrap() as usize;
    for pos in 0..header_end {
        for x in [0x01u8, 0x80, 0xff, 0x55] {
            let mut c = b.clone();
            c[pos] ^= x;
            let r = std::panic::catch_unwind(|| {
                check(&c);
            });
            assert!(r.is_ok(), "byte {pos} ^= {x:#x}");
        }
    }
}
