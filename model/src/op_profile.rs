//! Wall time per operation of the shared decoder: [`Timed`] wraps any [`DecoderOps`] and
//! times each call, so `strata bench --profile` can say where a CPU decode step goes (the
//! head matvec, the projections by kind, attention, norms...). The backend's operations are
//! synchronous on the CPU; on a GPU the figures would be launch times, so only the CPU
//! executor uses it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::decoder::{Block, Buf, DecoderOps};
use super::{Act, AttnSpec, MoeSpec};

/// Accumulated time and calls per operation label, plus the number of profiled evaluations.
#[derive(Debug, Default, Clone)]
pub struct OpProfile {
    pub ops: BTreeMap<&'static str, (Duration, u64)>,
    /// Wall time of whole forward chunks (ops plus everything between them).
    pub total: Duration,
    pub chunks: u64,
}

impl OpProfile {
    fn add(&mut self, label: &'static str, dt: Duration) {
        let e = self.ops.entry(label).or_default();
        e.0 += dt;
        e.1 += 1;
    }
    pub fn add_chunk(&mut self, dt: Duration) {
        self.total += dt;
        self.chunks += 1;
    }
    /// Time between and around the operations (dispatch, scratch sizing).
    pub fn unaccounted(&self) -> Duration {
        self.total.saturating_sub(self.ops.values().map(|v| v.0).sum())
    }
}

/// The label of a projection, from its input and outputs.
fn project_label(src: Buf, n_outs: usize) -> &'static str {
    match (src, n_outs) {
        (Buf::Xn, 3) => "project q,k,v",
        (Buf::Att, _) => "project attn_output",
        (Buf::Act, _) => "project ffn_down",
        _ => "project (other)",
    }
}

/// A backend whose every operation is timed into `profile`.
pub struct Timed<'a, B> {
    pub inner: &'a mut B,
    pub profile: &'a mut OpProfile,
}

impl<B> Timed<'_, B> {
    fn time<R>(&mut self, label: &'static str, f: impl FnOnce(&mut B) -> R) -> R {
        let t = Instant::now();
        let r = f(self.inner);
        self.profile.add(label, t.elapsed());
        r
    }
}

impl<B: DecoderOps> DecoderOps for Timed<'_, B> {
    type Mat = B::Mat;
    type Vector = B::Vector;
    type Error = B::Error;

    fn embed(&mut self, tok_embd: &Self::Mat, scale: Option<f32>) -> Result<(), Self::Error> {
        self.time("embed", |b| b.embed(tok_embd, scale))
    }
    fn norm(&mut self, src: Buf, w: &Self::Vector, dst: Buf) -> Result<(), Self::Error> {
        self.time("norm", |b| b.norm(src, w, dst))
    }
    fn head_norm(&mut self, buf: Buf, w: &Self::Vector, heads: usize) -> Result<(), Self::Error> {
        self.time("head_norm", |b| b.head_norm(buf, w, heads))
    }
    fn project(&mut self, src: Buf, outs: &[(&Self::Mat, Buf)]) -> Result<(), Self::Error> {
        self.time(project_label(src, outs.len()), |b| b.project(src, outs))
    }
    fn add_bias(&mut self, buf: Buf, bias: &Self::Vector) -> Result<(), Self::Error> {
        self.time("add_bias", |b| b.add_bias(buf, bias))
    }
    fn rope(&mut self, buf: Buf, heads: usize, spec: &AttnSpec) -> Result<(), Self::Error> {
        self.time("rope", |b| b.rope(buf, heads, spec))
    }
    fn scale(&mut self, buf: Buf, s: f32) -> Result<(), Self::Error> {
        self.time("scale", |b| b.scale(buf, s))
    }
    fn kv_store(&mut self, layer: usize) -> Result<(), Self::Error> {
        self.time("kv_store", |b| b.kv_store(layer))
    }
    fn attend(&mut self, layer: usize, spec: &AttnSpec) -> Result<(), Self::Error> {
        self.time("attend", |b| b.attend(layer, spec))
    }
    fn glu(&mut self, src: Buf, gate: &Self::Mat, up: &Self::Mat, act: Act) -> Result<(), Self::Error> {
        self.time("glu (gate, up, act)", |b| b.glu(src, gate, up, act))
    }
    fn moe(&mut self, layer: usize, src: Buf, w: [&Self::Mat; 4], spec: &MoeSpec) -> Result<(), Self::Error> {
        self.time("moe", |b| b.moe(layer, src, w, spec))
    }
    fn residual(&mut self, src: Buf, post_norm: Option<&Self::Vector>) -> Result<(), Self::Error> {
        self.time("residual", |b| b.residual(src, post_norm))
    }
    fn end_block(&mut self, layer: usize, block: Block) -> Result<(), Self::Error> {
        self.inner.end_block(layer, block)
    }
    fn end_layer(&mut self, layer: usize) -> Result<(), Self::Error> {
        self.inner.end_layer(layer)
    }
    fn head(&mut self, first: usize, norm: &Self::Vector, output: &Self::Mat) -> Result<(), Self::Error> {
        self.time("head (norm, output)", |b| b.head(first, norm, output))
    }
}
