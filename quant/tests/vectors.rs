//! Byte-exact checks against llama.cpp's own reference functions and gguf-py's numpy
//! dequantizers (`testdata/reference/quant-vectors`, see its `index.json`): our reference
//! quantizers must reproduce `quantize_row_q8_{K,1,0}_ref` bytes, and our dequantizers must
//! reproduce `dequantize_row_*` / `gguf.quants.dequantize` bit for bit.

use quant::{GgmlType, dequantize_row, quantize_row};

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/reference/quant-vectors/");

fn read(name: &str) -> Vec<u8> {
    let p = format!("{DIR}{name}");
    std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read reference vector {p}: {e}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

/// Quantize act_f32 with `ty` and compare with llama.cpp's bytes, reporting the first bad
/// block and byte.
fn check_act(ty: GgmlType, file: &str) {
    let x = f32s(&read("act_f32.bin"));
    assert_eq!(x.len(), 32 * 256);
    let want = read(file);
    let mut got = vec![0u8; ty.row_bytes(x.len()).unwrap()];
    quantize_row(ty, &x, &mut got).unwrap();
    assert_eq!(got.len(), want.len(), "{file}: size");
    if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
        let bs = ty.type_size();
        let blk = i / bs;
        panic!(
            "{file}: first mismatch at byte {i} (block {blk}, offset {}, input row {}): got {:#04x} want {:#04x}\n got block {:?}\nwant block {:?}",
            i % bs,
            blk * ty.block_size() / 256,
            got[i],
            want[i],
            &got[blk * bs..(blk + 1) * bs],
            &want[blk * bs..(blk + 1) * bs]
        );
    }
}

#[test]
fn q8_k_activations_byte_exact() {
    check_act(GgmlType::Q8K, "act_q8_K.bin");
}

#[test]
fn q8_1_activations_byte_exact() {
    check_act(GgmlType::Q8_1, "act_q8_1.bin");
}

#[test]
fn q8_0_activations_byte_exact() {
    check_act(GgmlType::Q8_0, "act_q8_0.bin");
}

/// Dequantize `w_<name>.bin` and compare bit for bit with `w_<name>_deq_f32.bin`.
fn check_deq(ty: GgmlType, name: &str) {
    let w = read(&format!("w_{name}.bin"));
    let want = f32s(&read(&format!("w_{name}_deq_f32.bin")));
    assert_eq!(ty.row_bytes(want.len()), Some(w.len()), "{name}: sizes disagree");
    let mut got = vec![0f32; want.len()];
    dequantize_row(ty, &w, &mut got).unwrap();
    for (i, (g, e)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.to_bits() == e.to_bits(),
            "{name}: element {i} (block {}): got {g:e} ({:#010x}) want {e:e} ({:#010x})",
            i / ty.block_size(),
            g.to_bits(),
            e.to_bits()
        );
    }
}

#[test]
fn dequantize_q4_0_bit_exact() {
    check_deq(GgmlType::Q4_0, "q4_0");
}
#[test]
fn dequantize_q4_1_bit_exact() {
    check_deq(GgmlType::Q4_1, "q4_1");
}
#[test]
fn dequantize_q5_0_bit_exact() {
    check_deq(GgmlType::Q5_0, "q5_0");
}
#[test]
fn dequantize_q5_1_bit_exact() {
    check_deq(GgmlType::Q5_1, "q5_1");
}
#[test]
fn dequantize_q8_0_bit_exact() {
    check_deq(GgmlType::Q8_0, "q8_0");
}
#[test]
fn dequantize_q4_k_bit_exact() {
    check_deq(GgmlType::Q4K, "q4_K");
}
#[test]
fn dequantize_q6_k_bit_exact() {
    check_deq(GgmlType::Q6K, "q6_K");
}
#[test]
fn dequantize_iq3_xxs_bit_exact() {
    check_deq(GgmlType::IQ3XXS, "iq3_xxs");
}

// The vectors below come from gguf-py's numpy dequantizers (`scripts/make-quant-vectors.py`).
#[test]
fn dequantize_q2_k_bit_exact() {
    check_deq(GgmlType::Q2K, "q2_K");
}
#[test]
fn dequantize_q3_k_bit_exact() {
    check_deq(GgmlType::Q3K, "q3_K");
}
#[test]
fn dequantize_iq4_xs_bit_exact() {
    check_deq(GgmlType::IQ4XS, "iq4_xs");
}
#[test]
fn dequantize_iq3_s_bit_exact() {
    check_deq(GgmlType::IQ3S, "iq3_s");
}
#[test]
fn dequantize_iq2_xxs_bit_exact() {
    check_deq(GgmlType::IQ2XXS, "iq2_xxs");
}
#[test]
fn dequantize_iq2_xs_bit_exact() {
    check_deq(GgmlType::IQ2XS, "iq2_xs");
}
#[test]
fn dequantize_iq2_s_bit_exact() {
    check_deq(GgmlType::IQ2S, "iq2_s");
}
#[test]
fn dequantize_iq1_s_bit_exact() {
    check_deq(GgmlType::IQ1S, "iq1_s");
}
#[test]
fn dequantize_iq1_m_bit_exact() {
    check_deq(GgmlType::IQ1M, "iq1_m");
}

/// Every file listed in index.json is covered by a test above (guards against new vectors
/// being added silently).
#[test]
fn index_lists_only_covered_files() {
    let idx = String::from_utf8(read("index.json")).unwrap();
    let covered = [
        "act_f32.bin",
        "act_q8_K.bin",
        "act_q8_1.bin",
        "act_q8_0.bin",
        "w_q4_K.bin",
        "w_q4_K_deq_f32.bin",
        "w_q6_K.bin",
        "w_q6_K_deq_f32.bin",
        "w_iq3_xxs.bin",
        "w_iq3_xxs_deq_f32.bin",
        "w_q5_0.bin",
        "w_q5_0_deq_f32.bin",
        "w_q8_0.bin",
        "w_q8_0_deq_f32.bin",
        "w_q4_0.bin",
        "w_q4_0_deq_f32.bin",
        "w_q4_1.bin",
        "w_q4_1_deq_f32.bin",
        "w_q5_1.bin",
        "w_q5_1_deq_f32.bin",
        "w_q2_K.bin",
        "w_q2_K_deq_f32.bin",
        "w_q3_K.bin",
        "w_q3_K_deq_f32.bin",
        "w_iq4_xs.bin",
        "w_iq4_xs_deq_f32.bin",
        "w_iq3_s.bin",
        "w_iq3_s_deq_f32.bin",
        "w_iq2_xxs.bin",
        "w_iq2_xxs_deq_f32.bin",
        "w_iq2_xs.bin",
        "w_iq2_xs_deq_f32.bin",
        "w_iq2_s.bin",
        "w_iq2_s_deq_f32.bin",
        "w_iq1_s.bin",
        "w_iq1_s_deq_f32.bin",
        "w_iq1_m.bin",
        "w_iq1_m_deq_f32.bin",
    ];
    for part in idx.split('"').filter(|s| s.ends_with(".bin")) {
        assert!(covered.contains(&part), "index.json lists {part}, which no test covers");
    }
}
