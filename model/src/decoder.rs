//! The shared decoder (gemma3, llama, qwen2, qwen3, qwen3moe), described once: its weights
//! ([`DecoderWeights`]) and the order of operations of one forward chunk ([`forward`]).
//!
//! A backend implements [`DecoderOps`] — what each operation does on its hardware, with its
//! own numerics — and never the order: `cpu::CpuChunk` runs it on the host, `gpu::exec::GpuChunk`
//! on a gfx11 device (a real card or the software RDNA3 device). The architectures differ in
//! switches of [`HParams`] (biases, Q/K norms, post norms, rope flavour, activation, MoE),
//! which this program reads; so adding an operation to an architecture is one line here plus
//! one method per backend (`docs/architecture.md`, "Adding an operation").
//!
//! ```text
//! x = embed(tokens)
//! per layer:  xn = norm(x)            q,k,v = project(xn) (+ bias)   q,k = head_norm, rope
//!             kv_store(k, v)          att = attend(q, cache)          x += post_norm?(att · Wo)
//!             xn = norm(x)            o = down(glu(xn)) or moe(xn)    x += post_norm?(o)
//! logits = norm(x[rows]) · W_out
//! ```

use super::{Act, AttnSpec, HParams, LayerKind, MoeSpec};

/// Which positions of an evaluation produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token (generation).
    Last,
    /// Every token (perplexity, `strata logits`).
    All,
}

/// The greedy token of one row of logits: the lowest id on ties (the rule used everywhere in
/// Strata).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// The activation buffers a forward chunk names; each backend maps them to its own scratch
/// (rows of the chunk's tokens).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buf {
    /// The residual stream, `[n][n_embd]`.
    X,
    /// A normed copy of `X`, the input of projections.
    Xn,
    Q,
    K,
    V,
    /// Attention output, `[n][n_head * head_dim]`.
    Att,
    /// A block's output before it joins the residual, `[n][n_embd]`.
    O,
    /// The FFN's gated activation, `[n][n_ff]`.
    Act,
}

/// The two blocks of a layer (backends count their cost per block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    Attention,
    Ffn,
}

/// The attention half of a layer.
#[derive(Clone, Debug)]
pub struct AttnWeights<M, V> {
    pub norm: V,
    pub wq: M,
    pub wk: M,
    pub wv: M,
    pub wo: M,
    pub bq: Option<V>,
    pub bk: Option<V>,
    pub bv: Option<V>,
    pub q_norm: Option<V>,
    pub k_norm: Option<V>,
    pub post_norm: Option<V>,
}

/// A dense gated FFN, or routed experts (stacks of `n_expert` matrices).
#[derive(Clone, Debug)]
pub enum Ffn<M> {
    Dense { gate: M, up: M, down: M },
    Moe { router: M, gate: M, up: M, down: M },
}

/// The FFN half of a layer.
#[derive(Clone, Debug)]
pub struct FfnWeights<M, V> {
    pub norm: V,
    pub ffn: Ffn<M>,
    pub post_norm: Option<V>,
}

#[derive(Clone, Debug)]
pub struct LayerWeights<M, V> {
    pub attn: AttnWeights<M, V>,
    pub ffn: FfnWeights<M, V>,
}

/// Every weight of a decoder, with matrices of type `M` and vectors (norms, biases) of type
/// `V`: `model::Mat` / `Vec<f32>` on the host (references into the mapped GGUF), device buffers
/// on a GPU. The GGUF names and shapes are resolved once, in `Model::from_gguf`; a backend
/// uploads with [`DecoderWeights::try_map`], so it cannot miss or reorder a weight.
#[derive(Clone, Debug)]
pub struct DecoderWeights<M, V> {
    pub tok_embd: M,
    pub output: M,
    pub output_norm: V,
    pub layers: Vec<LayerWeights<M, V>>,
}

/// A weight's place in the model, for messages and backends that treat some weights alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightName {
    TokEmbd,
    Output,
    OutputNorm,
    Layer(usize, &'static str),
}

impl std::fmt::Display for WeightName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightName::TokEmbd => f.write_str("token_embd.weight"),
            WeightName::Output => f.write_str("output.weight"),
            WeightName::OutputNorm => f.write_str("output_norm.weight"),
            WeightName::Layer(il, s) => write!(f, "blk.{il}.{s}"),
        }
    }
}

impl<M, V> DecoderWeights<M, V> {
    /// The same weights converted by `mat` / `vec` (e.g. uploaded to a device), each called
    /// with the weight's GGUF name.
    pub fn try_map<M2, V2, E>(
        &self,
        mut mat: impl FnMut(&M, WeightName) -> Result<M2, E>,
        mut vec: impl FnMut(&V, WeightName) -> Result<V2, E>,
    ) -> Result<DecoderWeights<M2, V2>, E> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for (il, l) in self.layers.iter().enumerate() {
            let n = |s| WeightName::Layer(il, s);
            let mut opt = |v: &Option<V>, s| v.as_ref().map(|v| vec(v, n(s))).transpose();
            let (a, f) = (&l.attn, &l.ffn);
            let attn = AttnWeights {
                bq: opt(&a.bq, "attn_q.bias")?,
                bk: opt(&a.bk, "attn_k.bias")?,
                bv: opt(&a.bv, "attn_v.bias")?,
                q_norm: opt(&a.q_norm, "attn_q_norm.weight")?,
                k_norm: opt(&a.k_norm, "attn_k_norm.weight")?,
                post_norm: opt(&a.post_norm, "post_attention_norm.weight")?,
                norm: vec(&a.norm, n("attn_norm.weight"))?,
                wq: mat(&a.wq, n("attn_q.weight"))?,
                wk: mat(&a.wk, n("attn_k.weight"))?,
                wv: mat(&a.wv, n("attn_v.weight"))?,
                wo: mat(&a.wo, n("attn_output.weight"))?,
            };
            let ffn = match &f.ffn {
                Ffn::Dense { gate, up, down } => Ffn::Dense {
                    gate: mat(gate, n("ffn_gate.weight"))?,
                    up: mat(up, n("ffn_up.weight"))?,
                    down: mat(down, n("ffn_down.weight"))?,
                },
                Ffn::Moe { router, gate, up, down } => Ffn::Moe {
                    router: mat(router, n("ffn_gate_inp.weight"))?,
                    gate: mat(gate, n("ffn_gate_exps.weight"))?,
                    up: mat(up, n("ffn_up_exps.weight"))?,
                    down: mat(down, n("ffn_down_exps.weight"))?,
                },
            };
            let post_norm = f.post_norm.as_ref().map(|v| vec(v, n("post_ffw_norm.weight"))).transpose()?;
            let ffn = FfnWeights { norm: vec(&f.norm, n("ffn_norm.weight"))?, ffn, post_norm };
            layers.push(LayerWeights { attn, ffn });
        }
        Ok(DecoderWeights {
            tok_embd: mat(&self.tok_embd, WeightName::TokEmbd)?,
            output: mat(&self.output, WeightName::Output)?,
            output_norm: vec(&self.output_norm, WeightName::OutputNorm)?,
            layers,
        })
    }
}

/// What a backend provides to run [`forward`]. Every method acts on the current chunk's `n`
/// tokens (their ids and positions are the backend's), reading and writing the named [`Buf`]s.
/// Norms are RMS norms with the model's epsilon; a backend chooses its own kernels (ggml's
/// float order for Gemma on the CPU, the ordered-numerics mode, fused launches) but not the
/// order of operations.
pub trait DecoderOps {
    /// A weight matrix (or expert stack) as this backend holds it.
    type Mat;
    /// A norm weight or bias as this backend holds it.
    type Vector;
    type Error;

    /// `X[i] = tok_embd[token i] · scale`.
    fn embed(&mut self, tok_embd: &Self::Mat, scale: Option<f32>) -> Result<(), Self::Error>;
    /// `dst = norm(src) ⊙ w`, rows of `n_embd`.
    fn norm(&mut self, src: Buf, w: &Self::Vector, dst: Buf) -> Result<(), Self::Error>;
    /// `buf = norm(buf) ⊙ w` per head (Q/K norms), `heads` per row.
    fn head_norm(&mut self, buf: Buf, w: &Self::Vector, heads: usize) -> Result<(), Self::Error>;
    /// `dst = src · Wᵀ` for each `(W, dst)`; all read the same input, so a backend may quantize
    /// it once or run the products in one pass.
    fn project(&mut self, src: Buf, outs: &[(&Self::Mat, Buf)]) -> Result<(), Self::Error>;
    /// `buf[row] += b`.
    fn add_bias(&mut self, buf: Buf, b: &Self::Vector) -> Result<(), Self::Error>;
    /// Rotary embedding of `heads` heads per row at the tokens' positions.
    fn rope(&mut self, buf: Buf, heads: usize, spec: &AttnSpec) -> Result<(), Self::Error>;
    /// `buf *= s`.
    fn scale(&mut self, buf: Buf, s: f32) -> Result<(), Self::Error>;
    /// `K`, `V` into layer `layer`'s cache at the tokens' positions.
    fn kv_store(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// `Att = softmax(Q Kᵀ · kq_scale) V` over layer `layer`'s cache (causal, `spec.window`).
    fn attend(&mut self, layer: usize, spec: &AttnSpec) -> Result<(), Self::Error>;
    /// `Act = act(src · gateᵀ) ⊙ (src · upᵀ)`.
    fn glu(&mut self, src: Buf, gate: &Self::Mat, up: &Self::Mat, act: Act) -> Result<(), Self::Error>;
    /// `O = Σ_top-k w_e · down_e(silu(gate_e src) ⊙ up_e src)`, the router over `src`, for the
    /// routed experts of layer `layer` (where an expert cache keeps its residents).
    fn moe(&mut self, layer: usize, src: Buf, w: [&Self::Mat; 4], spec: &MoeSpec) -> Result<(), Self::Error>;
    /// `X += post_norm(src)` (or `X += src`).
    fn residual(&mut self, src: Buf, post_norm: Option<&Self::Vector>) -> Result<(), Self::Error>;
    /// A block of layer `layer` is done (backends count its cost here).
    fn end_block(&mut self, layer: usize, block: Block) -> Result<(), Self::Error>;
    /// Layer `layer` is done (backends copy `X` here when tracing).
    fn end_layer(&mut self, layer: usize) -> Result<(), Self::Error>;
    /// Logits of rows `first..n`: `norm(X[rows]) · outputᵀ`.
    fn head(&mut self, first: usize, norm: &Self::Vector, output: &Self::Mat) -> Result<(), Self::Error>;
}

/// One forward chunk of the shared decoder: the only place its order of operations is written.
/// `logits_from`: the first row whose logits are wanted (None: no logits for this chunk).
pub fn forward<B: DecoderOps>(
    b: &mut B,
    hp: &HParams,
    w: &DecoderWeights<B::Mat, B::Vector>,
    logits_from: Option<usize>,
) -> Result<(), B::Error> {
    b.embed(&w.tok_embd, hp.embd_scale)?;
    for (il, lw) in w.layers.iter().enumerate() {
        let LayerKind::Attention(spec) = &hp.layers[il];
        attention(b, hp, il, spec, &lw.attn)?;
        b.end_block(il, Block::Attention)?;
        ffn(b, hp, il, &lw.ffn)?;
        b.end_block(il, Block::Ffn)?;
        b.end_layer(il)?;
    }
    if let Some(first) = logits_from {
        b.head(first, &w.output_norm, &w.output)?;
    }
    Ok(())
}

fn attention<B: DecoderOps>(
    b: &mut B,
    hp: &HParams,
    il: usize,
    spec: &AttnSpec,
    a: &AttnWeights<B::Mat, B::Vector>,
) -> Result<(), B::Error> {
    b.norm(Buf::X, &a.norm, Buf::Xn)?;
    b.project(Buf::Xn, &[(&a.wq, Buf::Q), (&a.wk, Buf::K), (&a.wv, Buf::V)])?;
    for (buf, bias) in [(Buf::Q, &a.bq), (Buf::K, &a.bk), (Buf::V, &a.bv)] {
        if let Some(bias) = bias {
            b.add_bias(buf, bias)?;
        }
    }
    for (buf, norm, heads) in [(Buf::Q, &a.q_norm, hp.n_head), (Buf::K, &a.k_norm, hp.n_head_kv)] {
        if let Some(norm) = norm {
            b.head_norm(buf, norm, heads)?;
        }
    }
    b.rope(Buf::Q, hp.n_head, spec)?;
    b.rope(Buf::K, hp.n_head_kv, spec)?;
    if hp.q_scale != 1.0 {
        b.scale(Buf::Q, hp.q_scale)?;
    }
    b.kv_store(il)?;
    b.attend(il, spec)?;
    b.project(Buf::Att, &[(&a.wo, Buf::O)])?;
    b.residual(Buf::O, a.post_norm.as_ref())
}

fn ffn<B: DecoderOps>(b: &mut B, hp: &HParams, il: usize, f: &FfnWeights<B::Mat, B::Vector>) -> Result<(), B::Error> {
    b.norm(Buf::X, &f.norm, Buf::Xn)?;
    match &f.ffn {
        Ffn::Dense { gate, up, down } => {
            b.glu(Buf::Xn, gate, up, hp.act)?;
            b.project(Buf::Act, &[(down, Buf::O)])?;
        }
        Ffn::Moe { router, gate, up, down } => {
            let spec = hp.moe.as_ref().expect("an MoE layer has MoE hyperparameters (checked at load)");
            b.moe(il, Buf::Xn, [router, gate, up, down], spec)?;
        }
    }
    b.residual(Buf::O, f.post_norm.as_ref())
}
