//! Prompt chunks: how a long prompt runs on the device. A call of more than [`PROMPT_MIN`]
//! tokens (a prompt, never a decode step or a speculative verify window) goes through the
//! program in chunks of the session's chunk (`--prefill`, up to [`PREFILL_MAX`]) instead of
//! windows of [`WINDOW`]; everything else about a chunk is the window's code
//! (`exec::GpuQwen4ExpChunk` runs `program::forward`, the one layer order), with three differences:
//!
//! - the dense projections get the prompt rule of the shared decoder's products
//!   (`gpu::linear`, `--gpu-prefill`): from `GEMM_MIN_TOKENS` tokens a quantized layer matrix
//!   is dequantized to f16 in [`Scratch`](super::scratch::Scratch)`::wdq` for one GEMM (or runs
//!   MMQ with `--gpu-prefill mmq`) instead of MMVQ 8 columns at a time;
//! - the GDN layers run the chunked delta rule (`GpuOps::gdn_prefill`,
//!   `gdn_delta_chunked_f32`, the CPU's `GdnMode::Chunked(64)`) in sub-chunks of
//!   [`PROMPT_CHUNK`] within one launch, which reads and writes the state once a sub-chunk
//!   instead of the token recurrence (`gdn_mix`, at most 8 tokens a launch);
//! - chunks run eagerly (no graph: the last chunk of a prompt has any size), and with an
//!   expert cache their routed experts read the router's choice back (the handoff's mailboxes
//!   hold a window), as qwen3moe's prompt chunks do: each chosen expert without a slot is
//!   copied through the staging ring once a chunk and runs on all its tokens of the chunk
//!   (`exec::moe`'s `experts_grouped`), never on the CPU pool (a chunk's expert has tens to
//!   thousands of tokens, where the device's product beats the PCIe copy it costs);
//! - the head runs only for the rows whose logits are read, [`LOGIT_ROWS`] rows a pass.
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

/// The chunked delta rule's sub-chunk (`abi::GDN_CHUNK_MAX`: its k·k and q·k triangles of
/// 64 x 64 f32 fill half of a workgroup's LDS) and one MMQ tile column (`abi::MMQ_COLS`): a
/// prompt chunk of more tokens runs the delta rule as sub-chunks of this many with the state
/// kept on the device between them, and MMQ as tiles of this many columns.
pub const PROMPT_CHUNK: usize = abi::GDN_CHUNK_MAX as usize;
const _: () = assert!(PROMPT_CHUNK == abi::MMQ_COLS as usize && PROMPT_CHUNK > WINDOW);

/// Most tokens of one prompt chunk (`--prefill`, the C++ engine's limit). A chunk's routed
/// experts are chosen together, so an expert without a cache slot crosses PCIe once a chunk:
/// the longer the chunk, the fewer times the same expert is streamed (the reason for chunks
/// longer than the weights' tiles; resident weights are read once per tile either way).
pub const PREFILL_MAX: usize = 8192;
const _: () = assert!(PREFILL_MAX <= abi::GDN_MAX_PREFILL_TOKENS as usize);

/// Rows of logits one pass of the head writes: a chunk's head runs in passes of this many rows
/// when every row's logits are read, so the logits buffer does not grow with the chunk
/// (8,192 rows of a 151,936-token vocabulary would be 5 GB).
pub(super) const LOGIT_ROWS: usize = PROMPT_CHUNK;

/// Calls of at most this many tokens run in windows of [`WINDOW`] (decode steps, speculative
/// verify windows of up to 9 tokens); longer ones in prompt chunks.
pub const PROMPT_MIN: usize = 2 * WINDOW;

/// The tokens of one step of a session whose prompts come in chunks of `prefill_chunk`
/// (`--prefill`): at most [`PREFILL_MAX`]; [`WINDOW`] (prompts in windows, as decode) in the
/// ordered mode, with `--gpu-prefill mmvq`, or when `prefill_chunk` is not longer than a window.
pub(super) fn chunk_cols(opts: &GpuOptions, prefill_chunk: usize) -> usize {
    if opts.ordered || opts.prefill == PrefillPath::Mmvq || prefill_chunk <= WINDOW {
        return WINDOW;
    }
    prefill_chunk.min(PREFILL_MAX)
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
