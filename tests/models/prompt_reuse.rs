//! Prompt reuse (`strata::prompt_reuse`): a request that begins with what the session already
//! consumed computes only the rest, and its output equals a cold run's. Checked on a KV-only
//! model (Gemma 3: truncation, sliding-window layers included) and on Flash-Next (GDN and PLE
//! states restored from the checkpoint the previous request ended with), on the CPU here and
//! on the software device in tests/gpu.

use std::path::{Path, PathBuf};

use strata::Device;
use strata::model::Logits;
use strata::prompt_reuse::PromptReuse;

pub fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/reference").join(rel)
}

pub const QWEN4EXP: &str = "tiny-qwen4exp/tiny-qwen4exp-public-f32.gguf";
pub const QWEN3MOE: &str = "tiny-qwen3moe/tiny-qwen3moe-v1024-q8_0.gguf";

pub fn load(path: &Path, device: Device) -> strata::Engine {
    let opts = strata::RunOptions { device, max_context: 512, ..Default::default() };
    strata::Engine::load(path, opts).unwrap_or_else(|e| panic!("loading {}: {e}", path.display()))
}

/// `n` greedy tokens from `logits` (the last call's), each run on `s` but the last (handed to
/// `consumed` as it is): the ids and the logits every step chose from.
fn greedy(
    e: &strata::Engine,
    s: &mut dyn strata::engine::Session,
    mut logits: Vec<f32>,
    n: usize,
    mut consumed: impl FnMut(u32),
) -> (Vec<u32>, Vec<Vec<f32>>) {
    let (mut ids, mut rows) = (Vec::new(), Vec::new());
    loop {
        let t = strata::model::argmax(&logits);
        ids.push(t);
        rows.push(logits.clone());
        if ids.len() == n {
            return (ids, rows);
        }
        e.eval(s, &[t], Logits::Last, &mut logits).unwrap();
        consumed(t);
    }
}

/// One served request as `strata --serve` runs it: the prompt after what `reuse` kept, then
/// `n` greedy tokens. Returns (tokens kept, generated ids, the logits every step chose from).
fn request(
    e: &strata::Engine,
    s: &mut dyn strata::engine::Session,
    reuse: &mut PromptReuse,
    prompt: &[u32],
    n: usize,
) -> (usize, Vec<u32>, Vec<Vec<f32>>) {
    let kept = reuse.resume(&*e.model, s, prompt).unwrap();
    let mut logits = Vec::new();
    e.eval(s, &prompt[kept..], Logits::Last, &mut logits).unwrap();
    reuse.consumed(&prompt[kept..]);
    let (ids, rows) = greedy(e, s, logits, n, |t| reuse.consumed(&[t]));
    reuse.finish(&*e.model, s);
    (kept, ids, rows)
}

/// The same calls on a fresh session with nothing reused: `chunks` in order, then `n` greedy
/// tokens. A reused state must give these logits bit for bit (the CPU's and the device's
/// products depend on how many tokens a call has, so a cold run is compared call for call).
fn cold(e: &strata::Engine, chunks: &[&[u32]], n: usize) -> (Vec<u32>, Vec<Vec<f32>>) {
    let mut s = e.new_session().unwrap();
    let mut logits = Vec::new();
    for c in chunks {
        e.eval(&mut *s, c, Logits::Last, &mut logits).unwrap();
    }
    greedy(e, &mut *s, logits, n, |_| {})
}

/// Turn 1, then turn 2 = turn 1's prompt + answer + new tokens on the same session, against
/// a cold run of the same calls; then a request that shares only part of turn 1's prompt.
pub fn check_reuse(e: &strata::Engine, what: &str) {
    let turn1: Vec<u32> = (0..40).map(|i| 5 + (i * 37) % 700).collect();
    let extra: Vec<u32> = (0..12).map(|i| 11 + (i * 53) % 600).collect();
    let mut reuse = PromptReuse::default();
    let mut s = e.new_session().unwrap();
    let (kept, answer, _) = request(e, &mut *s, &mut reuse, &turn1, 6);
    assert_eq!(kept, 0, "{what}: a fresh session has nothing to reuse");

    let turn2 = [&turn1[..], &answer, &extra].concat();
    let (kept, warm, warm_rows) = request(e, &mut *s, &mut reuse, &turn2, 8);
    // Everything the session consumed: turn 1's prompt and its answer but the last token.
    assert_eq!(kept, turn1.len() + answer.len() - 1, "{what}: turn 2 reused");
    let mut calls: Vec<&[u32]> = vec![&turn1];
    calls.extend(answer[..answer.len() - 1].chunks(1));
    calls.push(&turn2[kept..]);
    let (cold_ids, cold_rows) = cold(e, &calls, 8);
    assert_eq!(warm, cold_ids, "{what}: turn 2 with reuse differs from a cold run");
    assert!(warm_rows == cold_rows, "{what}: turn 2's logits with reuse are not a cold run's bit for bit");
    // Against turn 2 in one call (other products, so only reported).
    let (one, one_rows) = cold(e, &[&turn2], 8);
    let max =
        warm_rows.iter().flatten().zip(one_rows.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!(
        "{what}: turn 2 reused {kept} of {} prompt tokens; against turn 2 in one call: ids {}, max |logit diff| {max:.2e}",
        turn2.len(),
        if one == warm { "equal" } else { "differ" }
    );

    // A request that shares only the first 20 tokens: a KV-only model keeps them, a recurrent
    // one has no checkpoint there and starts over.
    let branch = [&turn1[..20], &extra].concat();
    let (kept, warm, _) = request(e, &mut *s, &mut reuse, &branch, 6);
    let recurrent = matches!(e.model.description(), strata::model::loaded::Description::Qwen4Exp(_));
    assert_eq!(kept, if recurrent { 0 } else { 20 }, "{what}: branch reuse");
    let want = if recurrent {
        cold(e, &[&branch], 6).0
    } else {
        // The kept cells came from turn 1's call of 40 tokens.
        let mut s = e.new_session().unwrap();
        let mut logits = Vec::new();
        e.eval(&mut *s, &turn1, Logits::Last, &mut logits).unwrap();
        assert!(e.model.truncate(&mut *s, 20).unwrap());
        e.eval(&mut *s, &extra, Logits::Last, &mut logits).unwrap();
        greedy(e, &mut *s, logits, 6, |_| {}).0
    };
    assert_eq!(warm, want, "{what}: a branch after reuse differs from a cold run");
}

#[test]
fn prompt_reuse_gemma3_cpu() {
    check_reuse(crate::models::models_util::gemma(), "gemma3 cpu");
}

#[test]
fn prompt_reuse_qwen3moe_cpu() {
    check_reuse(&load(&fixture(QWEN3MOE), Device::Cpu), "qwen3moe cpu");
}

#[test]
fn prompt_reuse_qwen4exp_cpu() {
    check_reuse(&load(&fixture(QWEN4EXP), Device::Cpu), "qwen4exp cpu");
}
