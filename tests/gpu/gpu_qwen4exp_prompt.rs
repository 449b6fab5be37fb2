//! Flash-Next's prompt chunks on the device (`gpu::qwen4exp::prompt`): a long prompt in
//! chunks of up to 64 tokens (dequantize + GEMM or MMQ products, the chunked delta rule,
//! routed experts by device dispatch or read back with an expert cache) against the same
//! prompt in windows of 8 and against the CPU backend, on the public tiny-qwen4exp fixtures
//! (f32, and the two-shard Q8_0 model), f16 and int8 caches. Every launch of the software
//! device is bounds-checked (a read or write outside its buffer fails the evaluation), and the
//! sessions here hold exactly the tokens they run, so a passing run had no out-of-bounds
//! access. Runs as `<name>::emu` and `<name>::hip`.

use crate::gpu::gpu_qwen4exp::greedy_in;
use crate::models::models_qwen4exp::{Cmp, compare, load_refs, model};
use strata::cpu::prelude::*;
use strata::gpu::model::{ExpertCacheSize, GpuOptions, PrefillPath};
use strata::gpu::qwen4exp::{GpuQwen4Exp, GpuQwen4ExpSession, PROMPT_CHUNK, WINDOW};
use strata::model::Logits;
use strata::model::qwen4exp::{GdnMode, KvType};
use strata::test_device;

const F32: &str = "tiny-qwen4exp-public-f32.gguf";
const Q8: &str = "tiny-qwen4exp-public-q8_0-split-00001-of-00002.gguf";
/// Prompt tokens of the parity tests: 64 + 64 + 22 (the last chunk below `GEMM_MIN_TOKENS`,
/// so both product rules run).
const N_PROMPT: usize = 150;

/// The first [`N_PROMPT`] tokens of llama.cpp's 300-token sequence (the indexer's sparse
/// selection starts after 64 positions).
fn prompt() -> Vec<u32> {
    load_refs("f32").into_iter().nth(2).expect("seq3").tokens[..N_PROMPT].to_vec()
}

fn load(device: &strata::gpu::test_device::TestDevice, file: &str, opts: GpuOptions) -> GpuQwen4Exp {
    let (_, api) = device.clone();
    GpuQwen4Exp::new(model(file), api, opts).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// All logits of `tokens` in one evaluation of a session of exactly `ctx` positions with prompt
/// chunks of `chunk` tokens ([`WINDOW`]: windows of 8).
fn run(g: &GpuQwen4Exp, kv: KvType, tokens: &[u32], ctx: usize, chunk: usize) -> (Vec<f32>, GpuQwen4ExpSession) {
    let mut sess = g.new_session_chunked(kv, ctx, chunk).unwrap();
    let mut got = Vec::new();
    g.eval(&mut sess, tokens, Logits::All, &mut got).unwrap_or_else(|e| panic!("chunk {chunk}: {e}"));
    (got, sess)
}

/// Q8_0's rule against the CPU (tests/gpu/gpu_qwen4exp.rs: Q8_1 activations on the device, as
/// MMVQ in windows and MMQ in chunks round them).
fn q8_ok(c: &Cmp) -> bool {
    c.max_abs <= 0.6 && c.mean_abs <= 0.02 && c.max_flip_gap <= 0.05
}

/// Q8_0 through the dequantize + f16 GEMM products of chunks of 32+ tokens (`--gpu-prefill
/// auto`): the activations are f16, not rounded to 8 bits per block as llama.cpp's CPU
/// (Q8_0) and the device's MMVQ / MMQ (Q8_1, the same scale per 32 values) round them, so the
/// logits move further from the CPU's (measured: mean 0.025, max 0.36 over 150 tokens, against
/// 0.008 / 0.25 for windows) while argmax flips stay where the CPU is nearly tied.
fn q8_gemm_ok(c: &Cmp) -> bool {
    c.max_abs <= 0.6 && c.mean_abs <= 0.04 && c.max_flip_gap <= 0.05
}

test_device!(
    /// 150 prompt tokens in chunks (64, 64, 22) against windows of 8 and against the CPU
    /// backend, f16 and int8 caches. f32 model: within 1e-3 of both (the windows' bound against
    /// the CPU; the chunked delta rule is within `GDN_CHUNK_TOL` of the recurrence). Q8_0:
    /// within [`q8_gemm_ok`] of the CPU and of the windows (f16 GEMM activations in chunks of
    /// 32+, Q8_1 MMVQ in windows). 3 chunks, each eager.
    model fn gpu_qwen4exp_prompt_chunks_match_windows_and_cpu(device) {
        let dev = device.0;
        let toks = prompt();
        for (file, f32_model) in [(F32, true), (Q8, false)] {
            let g = load(device, file, GpuOptions::default());
            let cpu = model(file);
            let v = g.n_vocab();
            for kv in [KvType::F16, KvType::Int8] {
                let (chunked, sess) = run(&g, kv, &toks, N_PROMPT, PROMPT_CHUNK);
                assert_eq!((sess.chunk, sess.eager_windows, sess.graph_replays, sess.n_past), (PROMPT_CHUNK, 3, 0, N_PROMPT), "{dev} {file} {kv:?}");
                let (windows, ws) = run(&g, kv, &toks, N_PROMPT, WINDOW);
                assert_eq!(ws.chunk, WINDOW);
                let want = cpu.forward(&mut cpu.new_state(kv), &toks, 0).unwrap();
                let (vs_win, vs_cpu, win_cpu) = (compare(&chunked, &windows, v), compare(&chunked, &want, v), compare(&windows, &want, v));
                eprintln!("{dev} {file} {kv:?}: chunks vs windows {vs_win:?}\n  chunks vs CPU {vs_cpu:?}\n  windows vs CPU {win_cpu:?}");
                if f32_model {
                    assert!(vs_win.max_abs <= 1e-3 && vs_cpu.max_abs <= 1e-3, "{dev} {file} {kv:?}");
                } else {
                    assert!(q8_gemm_ok(&vs_cpu) && q8_gemm_ok(&vs_win), "{dev} {file} {kv:?}");
                }
            }
        }
    }
);

test_device!(
    /// Against the CPU's chunked form (`GdnMode::Chunked(64)`: the same chunk boundaries as the
    /// device's 64-token chunks) the f32 model's 300-token prompt (sparse selection from
    /// position 64) stays within 1e-3, as it does against llama.cpp's recorded logits.
    model fn gpu_qwen4exp_prompt_chunks_300_tokens_match_llama_cpp(device) {
        let dev = device.0;
        let s = load_refs("f32").into_iter().nth(2).expect("seq3");
        let g = load(device, F32, GpuOptions::default());
        let (got, sess) = run(&g, KvType::F16, &s.tokens, s.tokens.len(), PROMPT_CHUNK);
        assert_eq!(sess.eager_windows, s.tokens.len().div_ceil(PROMPT_CHUNK), "{dev}");
        let v = g.n_vocab();
        let c = compare(&got, &s.logits.1, v);
        let mut cpu = model(F32);
        cpu.gdn_mode = GdnMode::Chunked(64);
        let want = cpu.forward(&mut cpu.new_state(KvType::F16), &s.tokens, 0).unwrap();
        let cc = compare(&got, &want, v);
        eprintln!("{dev} 300 tokens in chunks: vs llama.cpp {c:?}\n  vs the CPU's chunked form {cc:?}");
        assert!(c.max_abs <= 1e-3 && cc.max_abs <= 1e-3, "{dev}");
    }
);

test_device!(
    /// Greedy decoding after a prompt in one chunk (decode windows of 1: graphs on the Q8_0 model,
    /// whose experts run by device dispatch) prints the CPU backend's ids: llama.cpp's 24
    /// greedy ids after the 64-token sequence (one chunk) on the f32 model, and the CPU's 16
    /// after the 150-token prompt on the f32 model. On the Q8_0 model (Q8_1 or f16 activations
    /// on the device, Q8_0 on the CPU) the ids equal the CPU's up to a step where the CPU's two
    /// candidates are within 0.05 (the Q8_0 rule's flip gap), with the default dequantize +
    /// f16 GEMM and with `--gpu-prefill mmq`.
    model fn gpu_qwen4exp_greedy_after_prompt_chunks_equals_cpu(device) {
        let dev = device.0;
        let greedy = |g: &GpuQwen4Exp, prompt: &[u32], n: usize, graphs: bool| {
            let mut sess = g.new_session_chunked(KvType::F16, prompt.len() + n, 512).unwrap();
            let ids = greedy_in(g, &mut sess, prompt, n);
            assert_eq!(sess.chunk, prompt.len() + n, "{dev}: a chunk of --prefill 512 tokens, capped at the context");
            let chunks = 1;
            let want = if graphs { (chunks, n - 1) } else { (chunks + n - 1, 0) };
            assert_eq!((sess.eager_windows, sess.graph_replays), want, "{dev}: prompt chunks eager, decode windows as before");
            ids
        };
        let s = load_refs("f32").into_iter().nth(1).expect("seq2");
        let g = load(device, F32, GpuOptions::default());
        assert_eq!(greedy(&g, &s.tokens, s.greedy.len(), false), s.greedy, "{dev} f32 seq2");
        let toks = prompt();
        for (file, prefill) in [(F32, PrefillPath::Auto), (Q8, PrefillPath::Mmq), (Q8, PrefillPath::Auto)] {
            let g = load(device, file, GpuOptions { prefill, ..GpuOptions::default() });
            let cpu = model(file);
            let want = cpu.generate_greedy(&mut cpu.new_state(KvType::F16), &toks, 16).unwrap();
            let got = greedy(&g, &toks, 16, file == Q8);
            if file == F32 {
                assert_eq!(got, want, "{dev} {file} {prefill:?}");
                continue;
            }
            let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) else { continue };
            let history: Vec<u32> = toks.iter().chain(&want[..i]).copied().collect();
            let logits = cpu.forward(&mut cpu.new_state(KvType::F16), &history, 0).unwrap();
            let row = &logits[(history.len() - 1) * cpu.hp.n_vocab..];
            let gap = row[want[i] as usize] - row[got[i] as usize];
            eprintln!("{dev} {file} {prefill:?}: greedy ids part from the CPU's at step {i} ({} vs {}), where the CPU's logits differ by {gap}", got[i], want[i]);
            assert!(gap <= 0.05, "{dev} {file} {prefill:?}: step {i}: {got:?} vs {want:?}");
        }
    }
);

test_device!(
    /// With an expert cache smaller than the expert count (3 of 8 slots) the prompt chunks read
    /// the router's choice back (hits from their slots, misses streamed through the staging
    /// slot; the decode steps' misses on the CPU) and stay within the
    /// all-resident chunk path's tolerance; the decode windows after them go through the
    /// handoff as graphs (Q8_0) and still match; the counters add up (one lookup per token,
    /// layer and rank).
    model fn gpu_qwen4exp_prompt_chunks_with_expert_cache_match(device) {
        let dev = device.0;
        let toks = prompt();
        for (file, f32_model) in [(F32, true), (Q8, false)] {
            let resident = load(device, file, GpuOptions::default());
            let cached = load(device, file, GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), ..GpuOptions::default() });
            let v = resident.n_vocab();
            let mut out = Vec::new();
            for g in [&resident, &cached] {
                let mut sess = g.new_session_chunked(KvType::F16, N_PROMPT + 4, PROMPT_CHUNK).unwrap();
                let mut rows = Vec::new();
                g.eval(&mut sess, &toks, Logits::All, &mut rows).unwrap();
                for t in [5u32, 42, 79, 116] {
                    let mut row = Vec::new();
                    g.eval(&mut sess, &[t], Logits::Last, &mut row).unwrap();
                    rows.extend_from_slice(&row);
                }
                out.push((rows, sess.eager_windows, sess.graph_replays));
            }
            let c = compare(&out[1].0, &out[0].0, v);
            eprintln!("{dev} {file}: 3 of 8 slots vs every expert resident, prompt chunks + 4 decode steps: {c:?}");
            if f32_model {
                assert!(c.max_abs <= 1e-3, "{dev} {file}");
            } else {
                assert!(q8_gemm_ok(&c), "{dev} {file}");
                assert_eq!((out[1].1, out[1].2), (3, 4), "{dev} {file}: chunks eager, decode windows through the handoff's graphs");
            }
            let st = cached.expert_cache_stats().expect("a cache");
            assert_eq!(st.lookups, (N_PROMPT as u64 + 4) * 4 * 2, "{dev} {file}: {st}");
            assert!(st.hits > 0 && st.cpu > 0 && st.streamed_experts > 0, "{dev} {file}: {st}");
            // Only the 4 decode steps' misses (4 tokens x 4 layers x top 2 at most) reach the CPU.
            assert!(st.cpu <= 4 * 4 * 2, "{dev} {file}: {st}");
        }
    }
);

test_device!(
    /// The other prompt paths: `--gpu-prefill mmq` (int8 MMQ for the Q8_0 projections of chunks
    /// of 32+) within the Q8_0 rule of the CPU (as windows) and within [`q8_gemm_ok`] of the
    /// default (dequantize + f16 GEMM);
    /// routed experts by device dispatch equal the host-readback path bit for bit in chunks too;
    /// the ordered mode and `--gpu-prefill mmvq` keep windows of 8.
    model fn gpu_qwen4exp_prompt_chunk_paths(device) {
        use strata::gpu::model::MoePath;
        let dev = device.0;
        let toks = prompt();
        let cpu = model(Q8);
        let want = cpu.forward(&mut cpu.new_state(KvType::F16), &toks, 0).unwrap();
        let run_with = |opts: GpuOptions| run(&load(device, Q8, opts), KvType::F16, &toks, N_PROMPT, PROMPT_CHUNK).0;
        let auto = run_with(GpuOptions::default());
        let mmq = run_with(GpuOptions { prefill: PrefillPath::Mmq, ..GpuOptions::default() });
        let host = run_with(GpuOptions { moe: MoePath::Host, ..GpuOptions::default() });
        let v = cpu.hp.n_vocab;
        let (c_mmq, c_auto) = (compare(&mmq, &want, v), compare(&mmq, &auto, v));
        eprintln!("{dev} mmq chunks vs CPU {c_mmq:?}\n  mmq vs dequantize + GEMM {c_auto:?}");
        assert!(q8_ok(&c_mmq) && q8_gemm_ok(&c_auto), "{dev}");
        let differ = host.iter().zip(&auto).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{dev}: device dispatch vs host readback in chunks: {differ} of {} logits differ", host.len());
        for opts in [GpuOptions { ordered: true, ..GpuOptions::default() }, GpuOptions { prefill: PrefillPath::Mmvq, ..GpuOptions::default() }] {
            let g = load(device, F32, opts);
            assert_eq!(g.new_session_chunked(KvType::F16, 256, 512).unwrap().chunk, WINDOW, "{dev} {opts:?}");
        }
    }
);

test_device!(
    /// Three ways to run a prompt chunk's routed experts when their products stay MMVQ (the
    /// fixture's ~16 tokens an expert, under the prompt rule's 32) give the same Q8_0 logits bit
    /// for bit: every expert resident by device dispatch over the slots sorted by expert
    /// (`moe_sort_slots`), 3 of 8 in cache slots by one dispatch over the list of the read-back
    /// experts' rows (`Linear::experts_listed`), and `--gpu-moe host` one expert at a time.
    model fn gpu_qwen4exp_prompt_expert_paths_equal_bitwise(device) {
        use strata::gpu::model::MoePath;
        let dev = device.0;
        let toks = prompt();
        let logits = |opts: GpuOptions| run(&load(device, Q8, opts), KvType::F16, &toks, N_PROMPT, PROMPT_CHUNK).0;
        let sorted = logits(GpuOptions::default());
        let listed = logits(GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), ..GpuOptions::default() });
        let one_by_one = logits(GpuOptions { moe: MoePath::Host, ..GpuOptions::default() });
        for (what, got) in [("3 slots (listed dispatch)", &listed), ("--gpu-moe host (one expert a launch group)", &one_by_one)] {
            let n = got.iter().zip(&sorted).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(n, 0, "{dev}: {what} vs sorted device dispatch: {n} of {} logits differ", sorted.len());
        }
    }
);

test_device!(
    /// The routed experts of a prompt chunk read back (an expert cache, or `--gpu-moe host`) run
    /// each chosen expert once on all its tokens by the prompt rule of the products. With
    /// `--gpu-prefill dequant-gemm` (GEMM from 2 tokens, so the fixture's groups of ~16 take it)
    /// the Q8_0 logits with 3 of 8 slots equal the host-readback run with every expert resident
    /// bit for bit, differ from device dispatch (MMVQ) by the GEMM rounding only
    /// ([`q8_gemm_ok`]), and stay within it of the CPU backend.
    model fn gpu_qwen4exp_prompt_expert_groups_take_the_prompt_rule(device) {
        use strata::gpu::model::MoePath;
        let dev = device.0;
        let toks = prompt();
        let base = GpuOptions { prefill: PrefillPath::DequantGemm, ..GpuOptions::default() };
        let logits = |opts: GpuOptions| run(&load(device, Q8, opts), KvType::F16, &toks, N_PROMPT, PROMPT_CHUNK).0;
        let host = logits(GpuOptions { moe: MoePath::Host, ..base });
        let cached = logits(GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), ..base });
        let dispatch = logits(base);
        let n = cached.iter().zip(&host).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(n, 0, "{dev}: 3 slots vs every expert resident (host readback): {n} logits differ");
        let v = load(device, Q8, base).n_vocab();
        let c = compare(&host, &dispatch, v);
        eprintln!("{dev}: grouped (prompt rule) vs device dispatch (MMVQ): {c:?}");
        assert!(c.max_abs > 0.0 && q8_gemm_ok(&c), "{dev}: {c:?}");
        let cpu = model(Q8);
        let want = cpu.forward(&mut cpu.new_state(KvType::F16), &toks, 0).unwrap();
        let c = compare(&host, &want, v);
        assert!(q8_gemm_ok(&c), "{dev}: vs the CPU: {c:?}");
    }
);

test_device!(
    /// A 600-token prompt (llama.cpp's 300-token sequence twice) with 3 of 8 expert slots in
    /// one chunk (`--prefill 8192`, capped at the context): each expert without a slot crosses
    /// to the device once for the chunk, so the experts copied (admitted into free slots, or
    /// streamed through the staging ring) are at most one copy of every layer's experts (4
    /// layers x 8; the prompt chooses them all), where chunks of 64 copy them again each chunk.
    /// f32 model: every row's logits (`Logits::All`: the head in passes of 64 rows) within 1e-3
    /// of the CPU's (measured 1.7e-4, bit for bit the chunks of 64's), the last row's equal to
    /// its evaluation alone. Q8_0: within [`q8_gemm_ok`] of chunks of 64 (the CPU's Q8_0
    /// rounding puts both 0.13 from a tie at row 509, past the 300 tokens the rule was set on).
    model fn gpu_qwen4exp_long_prompt_chunk_copies_each_expert_once(device) {
        let dev = device.0;
        let seq = load_refs("f32").into_iter().nth(2).expect("seq3").tokens;
        let toks: Vec<u32> = seq.iter().chain(&seq).copied().collect();
        let n = toks.len();
        let cache = GpuOptions { expert_cache: Some(ExpertCacheSize::Slots(3)), ..GpuOptions::default() };
        for (file, runs_of) in [(F32, [(8192, Logits::All), (8192, Logits::Last)]), (Q8, [(8192, Logits::All), (PROMPT_CHUNK, Logits::All)])] {
            let cpu = model(file);
            let v = cpu.hp.n_vocab;
            let one_copy_each = (cpu.layers.len() * 8) as u64;
            let mut runs = Vec::new();
            for (chunk, want_all) in runs_of {
                let g = load(device, file, cache);
                let mut sess = g.new_session_chunked(KvType::F16, n, chunk).unwrap();
                let mut got = Vec::new();
                g.eval(&mut sess, &toks, want_all, &mut got).unwrap_or_else(|e| panic!("{dev} {file} chunk {chunk}: {e}"));
                let st = g.expert_cache_stats().expect("a cache");
                // The chunk's own copies; adaptive residency's swaps after it are for later windows.
                let copies = st.admitted + st.streamed_experts;
                eprintln!("{dev} {file} chunk {} ({} chunks): {copies} experts copied; {st}", sess.chunk, sess.eager_windows);
                assert_eq!(st.lookups, (n * cpu.layers.len() * 2) as u64, "{dev} {file}");
                assert_eq!(st.cpu, 0, "{dev} {file}: a prompt chunk's misses are streamed, not run on the CPU pool");
                runs.push((sess.chunk, sess.eager_windows, copies, got));
            }
            assert_eq!((runs[0].0, runs[0].1), (n, 1), "{dev} {file}: one chunk");
            assert!(runs[0].2 <= one_copy_each, "{dev} {file}: {} copies in one chunk, one copy of each expert is {one_copy_each}", runs[0].2);
            assert_eq!(runs[0].3.len(), n * v, "{dev} {file}: every row's logits");
            if file == F32 {
                let last = &runs[0].3[(n - 1) * v..];
                let differ = last.iter().zip(&runs[1].3).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
                assert_eq!(differ, 0, "{dev} {file}: the last row's logits, alone or with every row's");
                let want = cpu.forward(&mut cpu.new_state(KvType::F16), &toks, 0).unwrap();
                let c = compare(&runs[0].3, &want, v);
                eprintln!("{dev} {file}: one chunk of {n} vs the CPU {c:?}");
                assert!(c.max_abs <= 1e-3, "{dev} {file}: {c:?}");
            } else {
                assert!(runs[1].2 > 4 * runs[0].2, "{dev} {file}: chunks of 64 copy the experts again each chunk: {} vs {}", runs[1].2, runs[0].2);
                let c = compare(&runs[0].3, &runs[1].3, v);
                eprintln!("{dev} {file}: one chunk of {n} vs chunks of 64 {c:?}");
                assert!(q8_gemm_ok(&c), "{dev} {file}: {c:?}");
            }
        }
    }
);
