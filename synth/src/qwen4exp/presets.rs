//! The shapes `strata synth --preset` offers: the llama.cpp fixtures' (`public`), a smaller one
//! for fast tests (`tiny`) and Flash-Next's own dimensions for cost measurements (`flash-next`).

use super::{SynthConfig, SynthPle};
use quant::GgmlType;

impl SynthConfig {
    /// The fixtures' `public` preset: 4 layers G G G A(QSA r=4), hidden 256, PLE on layer 1.
    pub fn public() -> SynthConfig {
        SynthConfig {
            n_vocab: 1024,
            n_embd: 256,
            layers: vec![None, None, None, Some(4)],
            n_head: 4,
            n_head_kv: 2,
            head_dim: 64,
            n_rot: 16,
            rope_base: 1e7,
            ssm_k_heads: 2,
            ssm_v_heads: 4,
            ssm_state: 32,
            ssm_conv: 4,
            hc: 4,
            hc_rank: 32,
            idx_heads: 4,
            idx_dim: 32,
            idx_top_k: 16,
            n_expert: 8,
            n_expert_used: 2,
            n_ff_exp: 128,
            n_ff_shexp: 256,
            ple: Some(SynthPle {
                layer: 1,
                ngram: 3,
                heads_per_ngram: 4,
                conv_kernel: 4,
                min_head_vocab: 9000,
                table_type: GgmlType::Q8_0,
            }),
            matrix_type: GgmlType::F32,
            tied: false,
            mtp_stub: false,
            eps: 1e-6,
            expert_type: None,
            random_blocks: false,
        }
    }
}

impl SynthConfig {
    /// Flash-Next's dimensions for one layer of each kind (cost measurements, issue 15 item 4):
    /// a GDN layer (48 value heads and 16 key heads of 128, conv 4) with the PLE block, then a
    /// QSA layer (24 query heads of 256 with their gates, 2 KV heads, 64 roped dims, indexer
    /// ratio 4), hidden 2560, 4 streams of low rank 320, 512 experts top-10 of FFN 640 in
    /// IQ3_XXS, a shared expert of 640, vocabulary 248,320 (tied Q8_0 table), other matrices
    /// Q8_0, every quantized matrix as random blocks. Published: hidden, streams and rank,
    /// heads, experts, FFN, vocabulary; assumed: the GDN key heads, the indexer (8 heads of
    /// 128, top-256 cells), the shared expert's width, the PLE table (small: its rows are read
    /// on the host).
    pub fn qwen4exp() -> SynthConfig {
        SynthConfig {
            n_vocab: 248_320,
            n_embd: 2560,
            layers: vec![None, Some(4)],
            n_head: 24,
            n_head_kv: 2,
            head_dim: 256,
            n_rot: 64,
            rope_base: 1e7,
            ssm_k_heads: 16,
            ssm_v_heads: 48,
            ssm_state: 128,
            ssm_conv: 4,
            hc: 4,
            hc_rank: 320,
            idx_heads: 8,
            idx_dim: 128,
            idx_top_k: 256,
            n_expert: 512,
            n_expert_used: 10,
            n_ff_exp: 640,
            n_ff_shexp: 640,
            ple: Some(SynthPle {
                layer: 0,
                ngram: 3,
                heads_per_ngram: 4,
                conv_kernel: 4,
                min_head_vocab: 2000,
                table_type: GgmlType::Q8_0,
            }),
            matrix_type: GgmlType::Q8_0,
            tied: true,
            mtp_stub: false,
            eps: 1e-6,
            expert_type: Some(GgmlType::IQ3XXS),
            random_blocks: true,
        }
    }

    /// A smaller shape for fast tests: 4 layers G, QSA (r=2), dense attention, G (PLE on layer
    /// 3), hidden 128, vocab 300, 4 experts.
    pub fn tiny() -> SynthConfig {
        SynthConfig {
            n_vocab: 300,
            n_embd: 128,
            layers: vec![None, Some(2), Some(0), None],
            n_head: 4,
            n_head_kv: 1,
            head_dim: 32,
            n_rot: 8,
            rope_base: 10_000.0,
            ssm_k_heads: 1,
            ssm_v_heads: 2,
            ssm_state: 32,
            ssm_conv: 3,
            hc: 2,
            hc_rank: 32,
            idx_heads: 2,
            idx_dim: 32,
            idx_top_k: 6,
            n_expert: 4,
            n_expert_used: 2,
            n_ff_exp: 64,
            n_ff_shexp: 96,
            ple: Some(SynthPle {
                layer: 3,
                ngram: 2,
                heads_per_ngram: 4,
                conv_kernel: 2,
                min_head_vocab: 500,
                table_type: GgmlType::Q8_0,
            }),
            matrix_type: GgmlType::F32,
            tied: false,
            mtp_stub: false,
            eps: 1e-6,
            expert_type: None,
            random_blocks: false,
        }
    }
}
