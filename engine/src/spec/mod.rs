//! Lossless speculative decoding, greedy and sampled.
//!
//! A [`Drafter`] proposes up to N next tokens from the history; the target model scores
//! `[last accepted token, d1..dk]` in ONE forward call; row i of those logits is the target's
//! next-token logits after the accepted history plus `d1..di`. The drafts are then checked one
//! by one against the [`Sampler`]'s final distribution `p_i` of row i (repeat penalty, top-k,
//! top-p, min-p, temperature; the penalty's history includes the drafts accepted before i):
//!
//! ```text
//! window  = [last] + drafts[..k]          k ≤ N ≤ 8, each draft p ≥ spec-min-p (and all before it)
//! logits  = forward(window)               one call, k+1 rows
//! for i in 0..k:
//!     p_i = sampler.distribution(logits[i])
//!     u ~ U[0,1) from the sampler's RNG
//!     if u < p_i(d_i): accept d_i (record it in the penalty history), continue
//!     else: emit one draw from p_i with d_i removed (renormalised), stop the window
//! all k accepted: emit one draw from p_k (the bonus token)
//! if a draft was rejected: rollback the state to "consumed last + accepted drafts"
//! ```
//!
//! Why this is lossless. Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) with a
//! draft token x drawn from the drafter's distribution q accepts it with probability
//! `min(1, p(x) / q(x))` and, on rejection, draws from the residual
//! `max(0, p − q) / Σ max(0, p − q)`; the emitted token is then distributed exactly as p. Our
//! drafters are deterministic (the suffix drafter's lookup, the MTP head's argmax; their `p` in
//! [`Draft`] only gates the window through `--spec-min-p`), so q is a point mass on the draft d:
//! q(d) = 1, q(x) = 0 elsewhere. Then `min(1, p(d)/1) = p(d)` (accept iff `u < p(d)`), and
//! `max(0, p − q)` is p with d's mass removed (`max(0, p(d) − 1) = 0`, every other x keeps
//! p(x)): the residual is p without d, renormalised. Check: P(emit d) = p(d), and for x ≠ d
//! P(emit x) = (1 − p(d)) · p(x) / (1 − p(d)) = p(x). Applied row by row (each row's p over
//! exactly the accepted history, rows after the first rejection discarded) every emitted token
//! has the distribution plain sampling would give it, so the whole output is distributed as
//! plain sampling's. The seeded token sequences differ from plain sampling's (the RNG is also
//! drawn for acceptance tests), the distribution does not.
//!
//! Greedy (temperature <= 0) is the point-mass p on the argmax: a draft is accepted iff it is
//! the argmax (`u < 1` always, `u < 0` never) and a rejection emits the argmax, whatever u is.
//! So the greedy output equals plain greedy decoding token for token (bit-identical as long as
//! the model's batched forward is bit-identical to single steps, which the qwen4exp pass
//! guarantees and the tests check).
//!
//! Rollback goes through [`VerifyModel::checkpoint`] / [`VerifyModel::rollback`]: a model with
//! only a KV cache truncates it (no recomputation); a recurrent model (qwen4exp: GDN and PLE
//! state) restores its checkpoint and re-runs the accepted prefix (see [`loaded`]).
//!
//! Drafters here: [`SuffixDrafter`] (prompt lookup, no weights) and [`MtpDrafter`] (the
//! qwen4exp model's own multi-token-prediction head). A drafter that needs the target's hidden
//! states says so ([`Drafter::wants_hidden`]); the loop then runs the target through
//! [`VerifyModel::forward_hidden`] and hands the drafter every consumed token with its hidden
//! state ([`Drafter::observe`]): the prompt, each single step, and of a verify window only the
//! accepted part (whose hidden states the verify pass computed over the accepted history).

mod loaded;
mod mtp;
mod suffix;
#[cfg(test)]
mod tests;

pub use mtp::{CpuMtpHead, MtpDrafter, MtpDrafterStats, MtpHead};
pub use suffix::SuffixDrafter;

use crate::sampler::{Sampler, SamplerConfig};

/// Longest verify window: drafts per step.
pub const MAX_DRAFT: usize = 8;

/// One proposed token with the drafter's probability for it (see each drafter's docs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Draft {
    pub token: u32,
    pub p: f32,
}

/// Proposes continuations of a token history.
pub trait Drafter {
    /// Up to `max` tokens that may follow `history` (the prompt and every emitted token).
    fn propose(&mut self, history: &[u32], max: usize) -> Vec<Draft>;

    /// Whether [`Drafter::observe`] needs the target's hidden states (default: no).
    fn wants_hidden(&self) -> bool {
        false
    }

    /// The target consumed `tokens` (in order, continuing everything observed before) and
    /// produced `hidden [tokens.len()][d]` for them (empty when the model has none or the
    /// drafter did not ask). Rejected drafts are never observed. Default: ignored.
    fn observe(&mut self, tokens: &[u32], hidden: &[f32]) {
        let _ = (tokens, hidden);
    }

    /// Forgets the sequence: the next one starts at position 0 (a served engine's next request).
    fn reset(&mut self) {}
}

/// A target model that can score a window and roll back.
pub trait VerifyModel {
    type State;
    /// What [`VerifyModel::rollback`] needs (a KV-only model: just the position).
    type Checkpoint;
    type Error;

    fn n_vocab(&self) -> usize;
    /// Tokens consumed by `st` (the position of the next token).
    fn position(&self, st: &Self::State) -> usize;
    /// Runs `tokens` at `position(st)..`; logits `[tokens.len()][n_vocab]`.
    fn forward(&self, st: &mut Self::State, tokens: &[u32]) -> Result<Vec<f32>, Self::Error>;
    /// [`VerifyModel::forward`] that also returns a hidden state of every position
    /// (`[tokens.len()][d]`; qwen4exp: the wide residual its MTP head reads). Default: no
    /// hidden states (empty).
    fn forward_hidden(&self, st: &mut Self::State, tokens: &[u32]) -> Result<(Vec<f32>, Vec<f32>), Self::Error> {
        Ok((self.forward(st, tokens)?, Vec::new()))
    }
    fn checkpoint(&self, st: &Self::State) -> Self::Checkpoint;
    /// `st` has consumed `keep` + rejected tokens since `cp`; afterwards it must equal the
    /// state after consuming `keep` only (its forward logits are not needed). Returns how many
    /// tokens had to be recomputed (0 for a KV truncation).
    fn rollback(&self, st: &mut Self::State, cp: Self::Checkpoint, keep: &[u32]) -> Result<usize, Self::Error>;
}

/// `--spec N` and `--spec-min-p P`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpecConfig {
    /// Drafts per verify window, 1..=8 (clamped; 0 disables speculation).
    pub n_draft: usize,
    /// A draft enters the window only while it and every earlier draft have p ≥ this.
    pub min_p: f32,
}

impl Default for SpecConfig {
    fn default() -> SpecConfig {
        SpecConfig { n_draft: 4, min_p: 0.0 }
    }
}

/// Counters of one speculative generation (for `strata bench`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// Target forward calls of the decode phase that produced tokens (windows, with or
    /// without drafts; the prompt pass is not counted).
    pub verify_steps: u64,
    /// Windows that held at least one draft.
    pub windows_with_drafts: u64,
    /// Drafts put into windows / accepted.
    pub drafted: u64,
    pub accepted: u64,
    /// Windows with a rejected draft (rolled back), and the tokens the rollbacks recomputed
    /// (recurrent models re-run the accepted prefix; KV-only models recompute nothing).
    pub rollbacks: u64,
    pub rollback_tokens: u64,
    /// Tokens emitted in the decode phase (all but the first generated token).
    pub decoded: u64,
}

impl SpecStats {
    /// accepted / drafted (0 without drafts).
    pub fn acceptance_rate(&self) -> f64 {
        if self.drafted == 0 { 0.0 } else { self.accepted as f64 / self.drafted as f64 }
    }

    /// Tokens emitted per verify step (1.0 = no gain).
    pub fn tokens_per_verify(&self) -> f64 {
        if self.verify_steps == 0 { 0.0 } else { self.decoded as f64 / self.verify_steps as f64 }
    }
}

/// Lowest id on ties (the greedy rule used everywhere in Strata).
pub use model::argmax;

/// Greedy speculative generation of `n_gen` tokens after `prompt`: [`generate_spec`] with a
/// greedy sampler. Output and final state equal plain greedy decoding (prompt in one call, then
/// one token per call): `st` has consumed the prompt and all generated tokens but the last.
pub fn generate_greedy_spec<M: VerifyModel + ?Sized, D: Drafter + ?Sized>(
    model: &M,
    st: &mut M::State,
    prompt: &[u32],
    n_gen: usize,
    drafter: &mut D,
    cfg: SpecConfig,
) -> Result<(Vec<u32>, SpecStats), M::Error> {
    generate_spec(model, st, prompt, n_gen, drafter, cfg, &mut Sampler::new(SamplerConfig::greedy()))
}

/// Speculative generation of `n_gen` tokens after `prompt` with `sampler` (fresh: the loop
/// records the prompt and every emitted token in its penalty history). The output is
/// distributed exactly as plain sampling with the same config (greedy: equal token for token);
/// `st` has consumed the prompt and all generated tokens but the last.
pub fn generate_spec<M: VerifyModel + ?Sized, D: Drafter + ?Sized>(
    model: &M,
    st: &mut M::State,
    prompt: &[u32],
    n_gen: usize,
    drafter: &mut D,
    cfg: SpecConfig,
    sampler: &mut Sampler,
) -> Result<(Vec<u32>, SpecStats), M::Error> {
    let mut out = Vec::with_capacity(n_gen);
    let stats = stream_spec(model, st, prompt, n_gen, drafter, cfg, sampler, &mut |t| {
        out.push(t);
        true
    })?;
    Ok((out, stats))
}

/// How a verify window's draft fared (see [`verify_draft`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    Accept,
    /// Rejected; this token (drawn from the residual) is emitted instead and ends the window.
    Reject(u32),
}

/// The speculative sampling rule for a deterministic (point-mass) draft `draft` against the
/// target logits `row` (over the accepted history, recorded in `sampler`): accept iff
/// `u < p(draft)`, else draw from p without `draft`, renormalised (module docs).
pub fn verify_draft(sampler: &mut Sampler, row: &[f32], draft: u32) -> Verdict {
    let p = sampler.distribution(row);
    if sampler.uniform() < p.prob(draft) {
        Verdict::Accept
    } else {
        Verdict::Reject(p.draw_without(draft, sampler.uniform()))
    }
}

/// [`generate_spec`] handing each token to `emit` as soon as it is decided (a verify window's
/// accepted drafts one by one, in order); generation stops early when `emit` returns false (a
/// stop token, the client gone). The served engine's speculative loop.
#[allow(clippy::too_many_arguments)]
pub fn stream_spec<M: VerifyModel + ?Sized, D: Drafter + ?Sized>(
    model: &M,
    st: &mut M::State,
    prompt: &[u32],
    n_gen: usize,
    drafter: &mut D,
    cfg: SpecConfig,
    sampler: &mut Sampler,
    emit: &mut dyn FnMut(u32) -> bool,
) -> Result<SpecStats, M::Error> {
    stream_spec_with(model, st, prompt, n_gen, drafter, cfg, sampler, verify_draft, emit)
}

/// [`stream_spec`] with the acceptance rule as a parameter (the tests' negative controls run
/// the same loop with wrong rules).
#[allow(clippy::too_many_arguments)]
fn stream_spec_with<M: VerifyModel + ?Sized, D: Drafter + ?Sized>(
    model: &M,
    st: &mut M::State,
    prompt: &[u32],
    n_gen: usize,
    drafter: &mut D,
    cfg: SpecConfig,
    sampler: &mut Sampler,
    rule: fn(&mut Sampler, &[f32], u32) -> Verdict,
    emit: &mut dyn FnMut(u32) -> bool,
) -> Result<SpecStats, M::Error> {
    let v = model.n_vocab();
    let mut stats = SpecStats::default();
    if n_gen == 0 || prompt.is_empty() {
        return Ok(stats);
    }
    let want_hidden = drafter.wants_hidden();
    let run = |st: &mut M::State, toks: &[u32]| -> Result<(Vec<f32>, Vec<f32>), M::Error> {
        if want_hidden { model.forward_hidden(st, toks) } else { Ok((model.forward(st, toks)?, Vec::new())) }
    };
    for &t in prompt {
        sampler.accept(t);
    }
    let (logits, hidden) = run(st, prompt)?;
    drafter.observe(prompt, &hidden);
    let first = sampler.sample(&logits[logits.len() - v..]);
    sampler.accept(first);
    let mut history: Vec<u32> = prompt.to_vec();
    history.push(first);
    if !emit(first) {
        return Ok(stats);
    }
    // Tokens generated so far (the last one not yet consumed by the model).
    let mut n_out = 1;
    let n_draft = cfg.n_draft.min(MAX_DRAFT);
    while n_out < n_gen {
        let last = history[history.len() - 1];
        // A window with k drafts emits at most k + 1 tokens: never draft past n_gen.
        let budget = n_draft.min(n_gen - n_out - 1);
        let drafts: Vec<u32> = if budget == 0 {
            Vec::new()
        } else {
            drafter
                .propose(&history, budget)
                .into_iter()
                .take(budget)
                .take_while(|d| d.p >= cfg.min_p && (d.token as usize) < v)
                .map(|d| d.token)
                .collect()
        };
        stats.verify_steps += 1;
        if drafts.is_empty() {
            let (l, h) = run(st, &[last])?;
            drafter.observe(&[last], &h);
            let t = sampler.sample(&l);
            sampler.accept(t);
            history.push(t);
            n_out += 1;
            stats.decoded += 1;
            if !emit(t) {
                return Ok(stats);
            }
            continue;
        }
        let k = drafts.len();
        stats.windows_with_drafts += 1;
        stats.drafted += k as u64;
        let cp = model.checkpoint(st);
        let mut window = Vec::with_capacity(k + 1);
        window.push(last);
        window.extend_from_slice(&drafts);
        let (l, h) = run(st, &window)?;
        // Row m's distribution is over the accepted history: drafts[..m] are recorded first.
        let mut m = 0;
        let mut rejected = None;
        while m < k {
            match rule(sampler, &l[m * v..(m + 1) * v], drafts[m]) {
                Verdict::Accept => {
                    sampler.accept(drafts[m]);
                    m += 1;
                }
                Verdict::Reject(t) => {
                    rejected = Some(t);
                    break;
                }
            }
        }
        let next = match rejected {
            Some(t) => t,
            None => sampler.sample(&l[k * v..(k + 1) * v]),
        };
        sampler.accept(next);
        // Rows 0..=m saw only accepted tokens: their hidden states are the real ones.
        let d = h.len() / window.len();
        drafter.observe(&window[..m + 1], &h[..(m + 1) * d]);
        if m < k {
            stats.rollback_tokens += model.rollback(st, cp, &window[..m + 1])? as u64;
            stats.rollbacks += 1;
        }
        stats.accepted += m as u64;
        stats.decoded += (m + 1) as u64;
        n_out += m + 1;
        for &t in drafts[..m].iter().chain([&next]) {
            history.push(t);
            if !emit(t) {
                return Ok(stats);
            }
        }
    }
    Ok(stats)
}
