//! Bad input at load (issue 36): a weight block with a NaN or infinite scale is refused naming
//! the tensor and the block; a weight type no backend runs is refused naming the tensor and
//! the type and listing the supported ones. The files are tiny llama GGUFs written here.

use gguf::{GgufFile, GgufWriter, Value};
use model::Decoder;
use quant::GgmlType;

const D: usize = 64;
const VOCAB: usize = 16;

/// A one-layer llama (embedding 64, 2 heads, FFN 64) with Q8_0 matrices; `patch` may change
/// a tensor's type and bytes before it is written.
fn tiny(patch: impl Fn(&str, &mut GgmlType, &mut Vec<u8>)) -> GgufFile {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::Str("llama".into()));
    for (k, v) in [("block_count", 1), ("embedding_length", D), ("attention.head_count", 2), ("feed_forward_length", D)]
    {
        w.add_metadata(format!("llama.{k}"), Value::U32(v as u32));
    }
    let mut add = |name: &str, dims: &[u64], ty: GgmlType| {
        let n: u64 = dims.iter().product();
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 211) as f32 - 105.0) / 211.0).collect();
        let mut bytes = vec![0u8; ty.row_bytes(n as usize).unwrap()];
        quant::quantize_row(ty, &x, &mut bytes).unwrap();
        let mut ty = ty;
        patch(name, &mut ty, &mut bytes);
        w.add_tensor(name, dims, ty, bytes);
    };
    add("token_embd.weight", &[D as u64, VOCAB as u64], GgmlType::Q8_0);
    add("output_norm.weight", &[D as u64], GgmlType::F32);
    for n in ["attn_norm", "ffn_norm"] {
        add(&format!("blk.0.{n}.weight"), &[D as u64], GgmlType::F32);
    }
    for n in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
        add(&format!("blk.0.{n}.weight"), &[D as u64, D as u64], GgmlType::Q8_0);
    }
    GgufFile::from_bytes("tiny.gguf", w.to_bytes().unwrap()).unwrap()
}

fn load_err(g: GgufFile) -> String {
    match Decoder::from_gguf(g, std::path::Path::new("tiny.gguf")) {
        Ok(_) => panic!("a bad file loaded"),
        Err(e) => e.to_string(),
    }
}

/// Sets the f16 scale `d` (offset 0 of a Q8_0 block) of block `k`.
fn set_d(bytes: &mut [u8], k: usize, h: u16) {
    bytes[34 * k..34 * k + 2].copy_from_slice(&h.to_le_bytes());
}

#[test]
fn the_good_file_loads() {
    let m = Decoder::from_gguf(tiny(|_, _, _| {}), std::path::Path::new("tiny.gguf")).unwrap();
    assert_eq!(m.n_vocab, VOCAB);
}

#[test]
fn a_nan_scale_is_refused_naming_tensor_and_block() {
    let g = tiny(|name, _, b| {
        if name == "blk.0.attn_q.weight" {
            set_d(b, 17, 0x7e00);
        }
    });
    assert_eq!(load_err(g), "tensor 'blk.0.attn_q.weight': block 17 has a NaN scale (d), at byte 578 of its q8_0 data");
}

#[test]
fn an_infinite_scale_is_refused_naming_tensor_and_block() {
    // The last block of the token table, and of the FFN's down matrix (negative infinity).
    let last = D * VOCAB / 32 - 1;
    let g = tiny(|name, _, b| {
        if name == "token_embd.weight" {
            set_d(b, last, 0x7c00);
        }
    });
    let want = format!(
        "tensor 'token_embd.weight': block {last} has an infinite scale (d), at byte {} of its q8_0 data",
        34 * last
    );
    assert_eq!(load_err(g), want);
    let g = tiny(|name, _, b| {
        if name == "blk.0.ffn_down.weight" {
            set_d(b, 127, 0xfc00);
        }
    });
    assert!(load_err(g).starts_with("tensor 'blk.0.ffn_down.weight': block 127 has an infinite scale (d)"));
}

#[test]
fn an_unknown_weight_type_lists_the_supported_ones() {
    let g = tiny(|name, ty, b| {
        if name == "blk.0.ffn_up.weight" {
            // An integer type (a GGUF may hold one; no kernel takes it as a weight).
            *ty = GgmlType::I8;
            *b = vec![0; D * D];
        }
    });
    // Written out here: every type with a dequantizer and a dot in `quant`, in ggml's order.
    let supported = "f32, f16, q4_0, q4_1, q5_0, q5_1, q8_0, q8_1, q2_K, q3_K, q4_K, q5_K, q6_K, q8_K, \
                     iq2_xxs, iq2_xs, iq3_xxs, iq1_s, iq4_nl, iq3_s, iq2_s, iq4_xs, iq1_m, bf16";
    assert_eq!(
        load_err(g),
        format!(
            "tensor 'blk.0.ffn_up.weight': type i8 is not supported here (no kernel for this type; supported: {supported})"
        )
    );
}
