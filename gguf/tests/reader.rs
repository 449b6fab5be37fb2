//! Writer → reader round trips, and one test per corruption class: each must give its own
//! typed error naming the file/key/tensor, and no input (truncated or bit-flipped) may panic.

use std::path::{Path, PathBuf};

use gguf::{GgufError, GgufFile, GgufWriter, Value};
use quant::GgmlType;

fn tmp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("strata-gguf-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Deterministic bytes (the project's one RNG) so data comparisons are meaningful.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rng::SplitMix64::new(seed);
    (0..n).map(|_| r.next_u64() as u8).collect()
}

fn all_values() -> Vec<(String, Value)> {
    vec![
        ("general.architecture".into(), Value::Str("testarch".into())),
        ("t.u8".into(), Value::U8(250)),
        ("t.i8".into(), Value::I8(-7)),
        ("t.u16".into(), Value::U16(65000)),
        ("t.i16".into(), Value::I16(-30000)),
        ("t.u32".into(), Value::U32(4_000_000_000)),
        ("t.i32".into(), Value::I32(-2_000_000_000)),
        ("t.f32".into(), Value::F32(1.5e-6)),
        ("t.bool".into(), Value::Bool(true)),
        ("t.str".into(), Value::Str("héllo ▁ wörld".into())),
        ("t.u64".into(), Value::U64(u64::MAX - 3)),
        ("t.i64".into(), Value::I64(i64::MIN + 5)),
        ("t.f64".into(), Value::F64(-2.25)),
        (
            "t.arr_str".into(),
            Value::Array(vec![Value::Str("a".into()), Value::Str(String::new()), Value::Str("ccc".into())]),
        ),
        ("t.arr_f32".into(), Value::Array(vec![Value::F32(1.0), Value::F32(-0.5)])),
        ("t.arr_empty".into(), Value::Array(vec![])),
        (
            "t.nested".into(),
            Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)]), Value::Array(vec![Value::I32(3)])]),
        ),
    ]
}

/// A small model: f32 matrix, q8_0 matrix (2 blocks per row), q4_K vector, 1-d f32.
fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add_metadata(k, v);
    }
    w.add_tensor("tensor_a", &[4, 3], GgmlType::F32, bytes(48, 1));
    w.add_tensor("tensor_b", &[64, 2], GgmlType::Q8_0, bytes(2 * 2 * 34, 2));
    w.add_tensor("tensor_c", &[256], GgmlType::Q4K, bytes(144, 3));
    w.add_tensor("tensor_d", &[5], GgmlType::F32, bytes(20, 4));
    w
}

fn find(hay: &[u8], needle: &[u8]) -> usize {
    hay.windows(needle.len()).position(|w| w == needle).expect("pattern present")
}

/// Byte offset just after the name of tensor `name` in its tensor info.
fn after_tensor_name(b: &[u8], name: &str) -> usize {
    find(b, name.as_bytes()) + name.len()
}

fn parse(b: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes("mem.gguf", b)
}

#[test]
fn round_trip_all_value_types_and_tensors() {
    let d = tmp_dir("rt");
    let p = d.join("m.gguf");
    sample_writer().write(&p).unwrap();
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.version(), 3);
    assert_eq!(g.metadata(), &all_values()[..]);
    assert_eq!(g.architecture().unwrap(), "testarch");
    assert_eq!(g.get_u32("t.u16").unwrap(), 65000);
    assert_eq!(g.get_u32("t.u8").unwrap(), 250);
    assert!(matches!(g.get_u32("t.i8"), Err(GgufError::WrongType { .. })));
    assert!(matches!(g.get_u32("t.u64"), Err(GgufError::WrongType { .. })));
    assert_eq!(g.get_f32("t.f64").unwrap(), -2.25);
    assert_eq!(g.get_str("t.str").unwrap(), "héllo ▁ wörld");
    let e = g.get_u32("no.such.key").unwrap_err();
    assert!(matches!(e, GgufError::MissingKey { .. }) && e.to_string().contains("no.such.key"), "{e}");
    let e = g.get_str("t.u32").unwrap_err();
    assert!(e.to_string().contains("t.u32") && e.to_string().contains("m.gguf"), "{e}");

    let expect = [
        ("tensor_a", vec![4u64, 3], GgmlType::F32, bytes(48, 1)),
        ("tensor_b", vec![64, 2], GgmlType::Q8_0, bytes(136, 2)),
        ("tensor_c", vec![256], GgmlType::Q4K, bytes(144, 3)),
        ("tensor_d", vec![5], GgmlType::F32, bytes(20, 4)),
    ];
    assert_eq!(g.tensors().len(), expect.len());
    for (name, dims, ty, data) in expect {
        let t = g.tensor(name).unwrap();
        assert_eq!((t.dims.clone(), t.ty, t.n_bytes, t.file_index), (dims, ty, data.len(), 0));
        assert_eq!(t.offset % 32, 0);
        assert_eq!((g.data_offset(0).unwrap() + t.offset) % 32, 0);
        assert_eq!(g.tensor_data(t), &data[..], "{name}");
    }
    assert!(g.tensor("nope").is_none());
}

#[test]
fn custom_alignment_round_trip() {
    let mut w = sample_writer();
    w.add_metadata("general.alignment", Value::U32(256));
    let g = parse(w.to_bytes().unwrap()).unwrap();
    assert_eq!(g.alignment(), 256);
    assert_eq!(g.data_offset(0).unwrap() % 256, 0);
    for t in g.tensors() {
        assert_eq!(t.offset % 256, 0);
    }
    assert_eq!(g.tensor_data(g.tensor("tensor_c").unwrap()), &bytes(144, 3)[..]);
}

#[test]
fn split_round_trip_opens_from_any_shard() {
    let d = tmp_dir("split");
    let prefix = d.join("model").to_str().unwrap().to_string();
    let paths = sample_writer().write_split(&prefix, 3).unwrap();
    assert_eq!(paths.len(), 3);
    assert!(paths[1].to_str().unwrap().ends_with("model-00002-of-00003.gguf"));
    let single = parse(sample_writer().to_bytes().unwrap()).unwrap();
    for p in &paths {
        let g = GgufFile::open(p).unwrap();
        assert_eq!(g.paths().len(), 3);
        assert_eq!(g.get_str("t.str").unwrap(), "héllo ▁ wörld");
        assert_eq!(g.get_u32("split.count").unwrap(), 3);
        assert_eq!(g.tensors().len(), 4);
        let shards: Vec<usize> = g.tensors().iter().map(|t| t.file_index).collect();
        assert_eq!(shards, vec![0, 1, 2, 2]);
        for t in single.tensors() {
            assert_eq!(g.tensor_data(g.tensor(&t.name).unwrap()), single.tensor_data(t));
        }
    }
}

#[test]
fn split_errors() {
    let d = tmp_dir("split-err");
    let prefix = d.join("m").to_str().unwrap().to_string();
    let paths = sample_writer().write_split(&prefix, 3).unwrap();
    // A missing shard is an I/O error naming that shard.
    std::fs::remove_file(&paths[2]).unwrap();
    let e = GgufFile::open(&paths[0]).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }) && e.to_string().contains("m-00003-of-00003.gguf"), "{e}");
    // A shard copied under another name: split.count no longer matches.
    let lone = d.join("renamed.gguf");
    std::fs::copy(&paths[0], &lone).unwrap();
    let e = GgufFile::open(&lone).unwrap_err();
    assert!(matches!(e, GgufError::Split { .. }) && e.to_string().contains("split.count"), "{e}");
    // The same tensor name in two shards.
    let mut w = GgufWriter::new();
    w.add_tensor("x", &[4], GgmlType::F32, bytes(16, 1));
    w.add_tensor("y", &[4], GgmlType::F32, bytes(16, 2));
    let p2 = w.write_split(d.join("dup").to_str().unwrap(), 2).unwrap();
    let mut b = std::fs::read(&p2[1]).unwrap();
    let at = find(&b, b"\x01\x00\x00\x00\x00\x00\x00\x00y");
    b[at + 8] = b'x';
    std::fs::write(&p2[1], b).unwrap();
    let e = GgufFile::open(&p2[0]).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { ref tensor, .. } if tensor == "x"), "{e}");
}

#[test]
fn header_errors() {
    let good = sample_writer().to_bytes().unwrap();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(parse(b), Err(GgufError::BadMagic { .. })));
    for v in [1u32, 4, 0x0400_0000] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(parse(b), Err(GgufError::UnsupportedVersion { version, .. }) if version == v));
    }
    let mut b = good.clone();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(parse(b), Err(GgufError::BigEndian { version: 3, .. })));
    assert!(matches!(parse(good[..10].to_vec()), Err(GgufError::Truncated { .. })));
    assert!(matches!(parse(Vec::new()), Err(GgufError::Truncated { .. })));
    // Absurd counts are rejected before any allocation.
    let mut b = good.clone();
    b[8..16].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(parse(b), Err(GgufError::CountTooLarge { .. })));
    let mut b = good.clone();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(parse(b), Err(GgufError::CountTooLarge { .. })));
}

#[test]
fn metadata_errors() {
    let good = sample_writer().to_bytes().unwrap();
    // Oversized array count on t.arr_f32: key, u32 type (9), u32 elem type (6), u64 count.
    let mut b = good.clone();
    let at = find(&b, b"t.arr_f32") + 9 + 4 + 4;
    b[at..at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::CountTooLarge { .. }) && e.to_string().contains("t.arr_f32"), "{e}");
    // Oversized string length of t.str's value.
    let mut b = good.clone();
    let at = find(&b, b"t.str") + 5 + 4;
    b[at..at + 8].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::CountTooLarge { .. }) && e.to_string().contains("t.str"), "{e}");
    // Unknown value type on t.u16.
    let mut b = good.clone();
    let at = find(&b, b"t.u16") + 5;
    b[at..at + 4].copy_from_slice(&13u32.to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::UnknownValueType { ref key, ty: 13, .. } if key == "t.u16"), "{e}");
    // Unknown array element type.
    let mut b = good.clone();
    let at = find(&b, b"t.arr_f32") + 9 + 4;
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    assert!(matches!(parse(b), Err(GgufError::UnknownValueType { ty: 99, .. })));
    // Bool byte that is neither 0 nor 1.
    let mut b = good.clone();
    let at = find(&b, b"t.bool") + 6 + 4;
    b[at] = 7;
    assert!(matches!(parse(b), Err(GgufError::BadValue { ref key, .. }) if key == "t.bool"));
    // Duplicate key: rename t.i16 to t.u16.
    let mut b = good.clone();
    let at = find(&b, b"t.i16");
    b[at + 2] = b'u';
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateKey { ref key, .. } if key == "t.u16"), "{e}");
    // Alignment that is not a power of two.
    let mut w = sample_writer();
    w.add_metadata("general.alignment", Value::U32(64));
    let mut b = w.to_bytes().unwrap();
    let at = find(&b, b"general.alignment") + 17 + 4;
    b[at..at + 4].copy_from_slice(&48u32.to_le_bytes());
    assert!(matches!(parse(b), Err(GgufError::BadValue { ref key, .. }) if key == "general.alignment"));
    // Arrays nested beyond the depth bound.
    let mut v = Value::U8(1);
    for _ in 0..12 {
        v = Value::Array(vec![v]);
    }
    let mut w = GgufWriter::new();
    w.add_metadata("deep", v);
    assert!(matches!(parse(w.to_bytes().unwrap()), Err(GgufError::BadValue { ref key, .. }) if key == "deep"));
}

#[test]
fn tensor_errors() {
    let good = sample_writer().to_bytes().unwrap();
    // Field offsets after the name of tensor_b (2 dims): n_dims, dims, type, offset.
    let nb = after_tensor_name(&good, "tensor_b");
    let (dims_at, ty_at, off_at) = (nb + 4, nb + 4 + 16, nb + 4 + 16 + 4);

    let mut b = good.clone();
    b[ty_at..ty_at + 4].copy_from_slice(&4u32.to_le_bytes()); // removed Q4_2
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::UnknownTensorType { ref tensor, ty: 4, .. } if tensor == "tensor_b"), "{e}");

    let mut b = good.clone();
    b[dims_at..dims_at + 8].copy_from_slice(&33u64.to_le_bytes()); // not a multiple of 32
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::BadShape { ref tensor, .. } if tensor == "tensor_b"), "{e}");

    let mut b = good.clone();
    b[dims_at..dims_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    b[dims_at + 8..dims_at + 16].copy_from_slice(&(1u64 << 40).to_le_bytes()); // product overflows
    assert!(matches!(parse(b), Err(GgufError::BadShape { .. })));

    let mut b = good.clone();
    b[nb..nb + 4].copy_from_slice(&5u32.to_le_bytes()); // too many dims
    assert!(matches!(parse(b), Err(GgufError::BadShape { .. })));

    let mut b = good.clone();
    let off = u64::from_le_bytes(b[off_at..off_at + 8].try_into().unwrap());
    b[off_at..off_at + 8].copy_from_slice(&(off + 4).to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::Misaligned { ref tensor, .. } if tensor == "tensor_b"), "{e}");

    let mut b = good.clone();
    b[off_at..off_at + 8].copy_from_slice(&0u64.to_le_bytes()); // on top of tensor_a
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::Overlap { .. }) && e.to_string().contains("tensor_a"), "{e}");

    let mut b = good.clone();
    b[off_at..off_at + 8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    assert!(matches!(parse(b), Err(GgufError::OutOfRange { ref tensor, .. }) if tensor == "tensor_b"));
    let mut b = good.clone();
    b[off_at..off_at + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes()); // start overflows
    assert!(matches!(parse(b), Err(GgufError::OutOfRange { .. })));

    // Data section cut short: the last tensor runs past the end of the file.
    let d = parse(good.clone()).unwrap();
    let t = d.tensor("tensor_d").unwrap();
    let end = (d.data_offset(0).unwrap() + t.offset) as usize + t.n_bytes;
    let e = parse(good[..end - 1].to_vec()).unwrap_err();
    assert!(
        matches!(e, GgufError::OutOfRange { ref tensor, .. } if tensor == "tensor_d")
            && e.to_string().contains("mem.gguf"),
        "{e}"
    );
    assert!(parse(good[..end].to_vec()).is_ok());

    let mut b = good.clone();
    let at = find(&b, b"tensor_c");
    b[at + 7] = b'a'; // rename tensor_c -> tensor_a
    let e = parse(b).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { ref tensor, .. } if tensor == "tensor_a"), "{e}");
}

#[test]
fn writer_rejects_inconsistent_tensors() {
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[32], GgmlType::Q8_0, vec![0u8; 33]);
    assert!(matches!(w.to_bytes(), Err(GgufError::Writer(_))));
    let mut w = GgufWriter::new();
    w.add_tensor("a", &[4], GgmlType::F32, vec![0u8; 16]).add_tensor("a", &[4], GgmlType::F32, vec![0u8; 16]);
    assert!(matches!(w.to_bytes(), Err(GgufError::Writer(_))));
    let mut w = GgufWriter::new();
    w.add_metadata("mixed", Value::Array(vec![Value::U8(1), Value::I8(1)]));
    assert!(matches!(w.to_bytes(), Err(GgufError::Writer(_))));
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    let good = sample_writer().to_bytes().unwrap();
    let last_end = {
        let g = parse(good.clone()).unwrap();
        let t = g.tensor("tensor_d").unwrap();
        (g.data_offset(0).unwrap() + t.offset) as usize + t.n_bytes
    };
    for cut in 0..last_end {
        let r = parse(good[..cut].to_vec());
        assert!(r.is_err(), "truncated at {cut} of {} parsed", good.len());
    }
}

#[test]
fn byte_flips_never_panic() {
    let good = sample_writer().to_bytes().unwrap();
    let header_end = parse(good.clone()).unwrap().data_offset(0).unwrap() as usize;
    let mut ok = 0;
    let mut err = 0;
    for pos in 0..header_end {
        for x in [0x01u8, 0x80, 0xff, 0x55] {
            let mut b = good.clone();
            b[pos] ^= x;
            match std::panic::catch_unwind(|| parse(b).map(|g| g.tensors().len())) {
                Ok(Ok(_)) => ok += 1,
                Ok(Err(_)) => err += 1,
                Err(_) => panic!("panic with byte {pos} ^= {x:#x}"),
            }
        }
    }
    // Random multi-byte corruption, deterministic seed.
    let noise = bytes(4 * 4000, 99);
    for i in 0..4000 {
        let mut b = good.clone();
        for j in 0..4 {
            let r = noise[i * 4 + j] as usize * 7919 + i * 31;
            b[r % header_end] = noise[(i * 4 + j + 1) % noise.len()];
        }
        let r = std::panic::catch_unwind(|| parse(b).map(|g| g.tensors().len()));
        assert!(r.is_ok(), "panic in random corruption {i}");
    }
    assert!(err > ok / 4, "flips should mostly be detected ({ok} ok, {err} err)");
}

#[test]
fn open_nonexistent_names_the_file() {
    let e = GgufFile::open(Path::new("/nonexistent/dir/x.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }) && e.to_string().contains("/nonexistent/dir/x.gguf"), "{e}");
}
