//! `check_blocks`: a NaN or infinite scale in block k is reported as block k, valid blocks
//! pass. The scale offsets below are written out from ggml's block structs (ggml-common.h),
//! independently of the crate's table, and tied to the dequantizers: a bad scale at that
//! offset must make the block dequantize to non-finite values.

mod common;
use common::Rng;
use quant::{ALL_TYPES, BadBlock, BadScale, GgmlType, QuantError, check_blocks, dequantize_row};

/// How a type stores its float scales.
enum Scales {
    /// f16 fields at these byte offsets.
    F16(&'static [(usize, &'static str)]),
    /// Q8_K: one f32 `d` at offset 0.
    F32,
    /// IQ1_M: f16 `d` in the top nibbles of the 4 LE u16 scale words at byte 48.
    Iq1m,
}

fn scales(ty: GgmlType) -> Scales {
    use GgmlType::*;
    Scales::F16(match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4NL => &[(0, "d")],
        Q4_1 | Q5_1 => &[(0, "d"), (2, "m")],
        Q8_1 => &[(0, "d"), (2, "s")],
        Q4K | Q5K => &[(0, "d"), (2, "dmin")],
        Q2K => &[(80, "d"), (82, "dmin")],
        Q3K => &[(108, "d")],
        Q6K => &[(208, "d")],
        IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ1S | IQ4XS => &[(0, "d")],
        Q8K => return Scales::F32,
        IQ1M => return Scales::Iq1m,
        _ => panic!("{ty}: no scale layout in this test"),
    })
}

/// The block types: every type with a reference except the plain floats.
fn block_types() -> Vec<GgmlType> {
    let plain = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
    ALL_TYPES.iter().copied().filter(|t| t.has_reference() && !plain.contains(t)).collect()
}

/// Writes the f16 `h` (Q8_K: its f32 value) into field `field` of block `k`.
fn set(ty: GgmlType, q: &mut [u8], k: usize, field: &str, h: u16) {
    let b = &mut q[k * ty.type_size()..(k + 1) * ty.type_size()];
    match scales(ty) {
        Scales::F16(f) => {
            let off = f.iter().find(|x| x.1 == field).unwrap().0;
            b[off..off + 2].copy_from_slice(&h.to_le_bytes());
        }
        Scales::F32 => b[..4].copy_from_slice(&quant::f16_to_f32(h).to_le_bytes()),
        Scales::Iq1m => {
            for w in 0..4 {
                let nib = ((h >> (4 * w)) & 0xf) as u8;
                let hi = &mut b[48 + 2 * w + 1];
                *hi = (*hi & 0x0f) | (nib << 4);
            }
        }
    }
}

fn fields(ty: GgmlType) -> Vec<&'static str> {
    match scales(ty) {
        Scales::F16(f) => f.iter().map(|x| x.1).collect(),
        _ => vec!["d"],
    }
}

/// Finite f16 scales: 1, the largest, its negative, the smallest subnormal, −0.
const FINITE: [u16; 5] = [0x3c00, 0x7bff, 0xfbff, 0x0001, 0x8000];
/// (bits, fault): quiet NaN, a NaN with a low payload, a negative NaN, ±infinity.
const BAD: [(u16, BadScale); 5] = [
    (0x7e00, BadScale::NaN),
    (0x7c01, BadScale::NaN),
    (0xfe00, BadScale::NaN),
    (0x7c00, BadScale::Inf),
    (0xfc00, BadScale::Inf),
];

/// `n` blocks of random bytes with random finite scales.
fn valid_blocks(ty: GgmlType, n: usize, r: &mut Rng) -> Vec<u8> {
    let mut q: Vec<u8> = (0..n * ty.type_size()).map(|_| r.next_u64() as u8).collect();
    for k in 0..n {
        for f in fields(ty) {
            set(ty, &mut q, k, f, FINITE[(r.next_u64() % 5) as usize]);
        }
    }
    q
}

fn dequantizes_finite(ty: GgmlType, block: &[u8]) -> bool {
    let mut y = vec![0f32; ty.block_size()];
    dequantize_row(ty, block, &mut y).unwrap();
    y.iter().all(|v| v.is_finite())
}

#[test]
fn valid_blocks_pass() {
    let mut r = Rng::new(36);
    for ty in block_types() {
        let q = valid_blocks(ty, 9, &mut r);
        assert_eq!(check_blocks(ty, &q), Ok(()), "{ty}");
        assert!(q.chunks(ty.type_size()).all(|b| dequantizes_finite(ty, b)), "{ty}");
        assert_eq!(check_blocks(ty, &[]), Ok(()), "{ty}: no blocks");
    }
}

#[test]
fn a_bad_scale_in_block_k_is_reported_as_block_k() {
    let mut r = Rng::new(37);
    for ty in block_types() {
        for k in [0usize, 4, 8] {
            for field in fields(ty) {
                for (h, why) in BAD {
                    let mut q = valid_blocks(ty, 9, &mut r);
                    set(ty, &mut q, k, field, h);
                    let want = QuantError::BadBlock { ty, bad: BadBlock { block: k, field, why } };
                    assert_eq!(check_blocks(ty, &q), Err(want), "{ty} block {k} {field} {h:#06x}");
                    // The field is really a scale: the dequantizer turns it into non-finite
                    // values (Q8_1's `s` is only used by dots).
                    let b = &q[k * ty.type_size()..(k + 1) * ty.type_size()];
                    assert_eq!(dequantizes_finite(ty, b), field == "s", "{ty} {field}");
                }
            }
        }
    }
}

#[test]
fn the_first_bad_block_is_reported() {
    let mut r = Rng::new(38);
    for ty in block_types() {
        let f = fields(ty);
        let last = *f.last().unwrap();
        let mut q = valid_blocks(ty, 9, &mut r);
        set(ty, &mut q, 6, f[0], 0x7c00);
        set(ty, &mut q, 2, last, 0x7e00);
        let got = check_blocks(ty, &q);
        let want = QuantError::BadBlock { ty, bad: BadBlock { block: 2, field: last, why: BadScale::NaN } };
        assert_eq!(got, Err(want), "{ty}");
        // Two bad fields in one block: the first field is named.
        set(ty, &mut q, 2, f[0], 0xfc00);
        let want = QuantError::BadBlock { ty, bad: BadBlock { block: 2, field: f[0], why: BadScale::Inf } };
        assert_eq!(check_blocks(ty, &q), Err(want), "{ty}");
    }
}

#[test]
fn message_names_block_and_field() {
    let mut q = vec![0u8; 34 * 20];
    q[34 * 17..34 * 17 + 2].copy_from_slice(&0x7e00u16.to_le_bytes());
    let e = check_blocks(GgmlType::Q8_0, &q).unwrap_err();
    assert_eq!(e.to_string(), "q8_0: block 17 has a NaN scale (d)");
    let mut q = vec![0u8; 144 * 3];
    q[144 + 2..144 + 4].copy_from_slice(&0xfc00u16.to_le_bytes());
    let e = check_blocks(GgmlType::Q4K, &q).unwrap_err();
    assert_eq!(e.to_string(), "q4_K: block 1 has an infinite scale (dmin)");
}

#[test]
fn lengths_plain_floats_and_unknown_layouts() {
    for ty in block_types() {
        let q = vec![0u8; 3 * ty.type_size() - 1];
        assert!(matches!(check_blocks(ty, &q), Err(QuantError::BadLength { .. })), "{ty}");
    }
    // Plain floats have no block scales: their values are not this check's business.
    let nan = [0x00, 0x00, 0xc0, 0x7f];
    assert_eq!(check_blocks(GgmlType::F32, &nan), Ok(()));
    assert_eq!(check_blocks(GgmlType::F16, &[0x00, 0x7e]), Ok(()));
    assert_eq!(check_blocks(GgmlType::BF16, &[0xc0, 0x7f]), Ok(()));
    for ty in ALL_TYPES.into_iter().filter(|t| !t.has_reference()) {
        let q = vec![0u8; ty.type_size()];
        assert_eq!(check_blocks(ty, &q), Err(QuantError::Unsupported(ty)), "{ty}");
    }
}

/// Speed on a 1 GiB buffer of valid blocks, per type (the pass runs over every weight byte at
/// load): `cargo test -p quant --release --test validate -- --ignored --nocapture speed`.
#[test]
#[ignore]
fn speed() {
    let mut r = Rng::new(39);
    for ty in [GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4K, GgmlType::Q6K, GgmlType::IQ1M] {
        let n = (1usize << 30) / ty.type_size();
        let one = valid_blocks(ty, 1, &mut r);
        let q: Vec<u8> = one.iter().copied().cycle().take(n * ty.type_size()).collect();
        check_blocks(ty, &q).unwrap(); // pages in
        let t = std::time::Instant::now();
        let reps = 3;
        for _ in 0..reps {
            check_blocks(ty, std::hint::black_box(&q)).unwrap();
        }
        let s = t.elapsed().as_secs_f64() / reps as f64;
        println!("{ty}: {:.1} GB/s ({:.0} ms per GiB)", q.len() as f64 / s / 1e9, s * 1e3);
    }
    // The machine's read rate for comparison: a sum over every u64 of a 1 GiB buffer.
    let q = vec![1u64; 1 << 27];
    let t = std::time::Instant::now();
    let sum: u64 = std::hint::black_box(&q).iter().fold(0, |a, &x| a.wrapping_add(x));
    let s = t.elapsed().as_secs_f64();
    println!("read every byte (sum {sum}): {:.1} GB/s", 8.0 * q.len() as f64 / s / 1e9);
}
