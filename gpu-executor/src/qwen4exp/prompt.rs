//! Prompt chunks: how a long prompt runs on the device. A call of more than [`PROMPT_MIN`]
//! tokens (a prompt, never a decode step or a speculative verify window) goes through the
//! program in chunks of up to the session's chunk ([`PROMPT_CHUNK`] by default) instead of
//! windows of [`WINDOW`]; everything else about a chunk is the window's code
//! (`exec::GpuQwen4ExpChunk` runs `program::forward`, the one layer order), with three differences:
//!
//! - the dense projections get the prompt rule of the shared decoder's products
//!   (`gpu::linear`, `--gpu-prefill`): from `GEMM_MIN_TOKENS` tokens a quantized layer matrix
//!   is dequantized to f16 in [`Scratch`](super::scratch::Scratch)`::wdq` for one GEMM (or runs
//!   MMQ with `--gpu-prefill mmq`) instead of MMVQ 8 columns at a time;
//! - the GDN layers run the chunked delta rule (`GpuOps::gdn_prefill`,
//!   `gdn_delta_chunked_f32`, the CPU's `GdnMode::Chunked`), which reads and writes the state
//!   once a chunk instead of the token recurrence (`gdn_mix`, at most 8 tokens a launch);
//! - chunks run eagerly (no graph: the last chunk of a prompt has any size), and with an
//!   expert cache their routed experts read the router's choice back (the handoff's mailboxes
//!   hold a window), as qwen3moe's prompt chunks do.
//!
//! The other kernels (GR read/write, PLE block, QSA attention, the MoE router and combine)
//! take any token count; routed experts by device dispatch go in groups of tokens whose slots
//! fit one `mmvq_moe` launch (`Linear::experts_by_dispatch`), as in a window.
//!
//! The ordered mode (`--ordered`) keeps windows of 8: its products are `mmv_ordered` (at most
//! 8 columns) and its delta rule the CPU's token order, so it stays bit-identical to the CPU.

use super::WINDOW;
use super::weights::DevWeights;
use crate::abi;
use crate::options::{GpuOptions, PrefillPath};
use crate::upload::{DevMat, MatKind};

/// Most tokens of one prompt chunk: the chunked delta rule's chunk (`abi::GDN_CHUNK_MAX`: its
/// k·k and q·k triangles of 64 x 64 f32 fill half of a workgroup's LDS), so each GDN launch
/// reads and writes the state once; and one MMQ tile column (`abi::MMQ_COLS`), so each weight
/// tile is read once a chunk. Beyond it the weights are read once per 64 tokens anyway, while
/// the scratch (every activation, and the logits `[chunk][n_vocab]`) grows with the chunk.
pub const PROMPT_CHUNK: usize = abi::GDN_CHUNK_MAX as usize;
const _: () = assert!(PROMPT_CHUNK == abi::MMQ_COLS as usize && PROMPT_CHUNK > WINDOW);

/// Calls of at most this many tokens run in windows of [`WINDOW`] (decode steps, speculative
/// verify windows of up to 9 tokens); longer ones in prompt chunks.
pub const PROMPT_MIN: usize = 2 * WINDOW;

/// The tokens of one step of a session whose prompts come in chunks of `prefill_chunk`
/// (`--prefill`): at most [`PROMPT_CHUNK`]; [`WINDOW`] (prompts in windows, as decode) in the
/// ordered mode, with `--gpu-prefill mmvq`, or when `prefill_chunk` is not longer than a window.
pub(super) fn chunk_cols(opts: &GpuOptions, prefill_chunk: usize) -> usize {
    if opts.ordered || opts.prefill == PrefillPath::Mmvq || prefill_chunk <= WINDOW {
        return WINDOW;
    }
    prefill_chunk.min(PROMPT_CHUNK)
}

/// f32 bytes of the largest quantized matrix that a prompt chunk's product may dequantize
/// (`Linear::dequant_scratch_bytes`): every layer projection, the GR mixers and the shared
/// expert; not the output matrix or the routed experts (they keep MMVQ, as in the shared
/// decoder).
pub(super) fn dequant_scratch_bytes(w: &DevWeights) -> usize {
    let mut mats: Vec<&DevMat> = vec![&w.out_hc.down, &w.out_hc.up];
    if let Some(p) = &w.ple {
        mats.extend([&p.key, &p.value]);
    }
    for l in &w.layers {
        for h in [&l.hc_attn, &l.hc_ffn] {
            mats.extend([&h.down, &h.up]);
            mats.extend(h.inject.as_ref());
        }
        match &l.mixer {
            super::weights::DevMixer::Gdn(g) => mats.extend([&g.qkv, &g.gate, &g.beta, &g.alpha, &g.out]),
            super::weights::DevMixer::Attn(a) => {
                mats.extend([&a.q, &a.k, &a.v, &a.o]);
                if let Some((q, k)) = &a.ix {
                    mats.extend([q, k]);
                }
            }
        }
        let m = &l.moe;
        mats.extend([&m.router, &m.shared_gate, &m.shared.gate, &m.shared.up, &m.shared.down]);
    }
    mats.into_iter().filter(|m| matches!(m.kind, MatKind::Q(_))).map(|m| m.rows * m.cols * 4).max().unwrap_or(0)
}
