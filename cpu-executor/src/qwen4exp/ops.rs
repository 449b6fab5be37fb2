//! Flash-Next's operations ([`Qwen4ExpOps`]) on the host, for one micro-batch: each calls the
//! layer's CPU arithmetic in the sibling modules (GDN, QSA, GR, MoE, PLE), which match
//! llama.cpp on the public fixtures.

use super::linear::{Numerics, NumericsCpu};
use crate::prelude::*;
use model::error::EngineError;
use model::qwen4exp::GdnMode;
use model::qwen4exp::program::{Qwen4ExpOps, Site};
use model::qwen4exp::{LayerState, Mixer, Qwen4Exp, SeqState, Trace};

/// One micro-batch of a Flash-Next sequence on the CPU.
pub struct CpuQwen4ExpChunk<'a> {
    m: &'a Qwen4Exp,
    st: &'a mut SeqState,
    toks: &'a [u32],
    /// The hyper-connection residual streams, `[n][hc][n_embd]`.
    r: Vec<f32>,
    x: Vec<f32>,
    y: Vec<f32>,
    /// Per-stream injection weights of the last mix, `[n][hc]`.
    inj: Vec<f32>,
    logits: &'a mut [f32],
    trace: Option<&'a mut Trace>,
    /// The wide residual `R` before the head mixer (the MTP head's input), when wanted.
    hidden: Option<&'a mut [f32]>,
}

impl<'a> CpuQwen4ExpChunk<'a> {
    pub fn new(
        m: &'a Qwen4Exp,
        st: &'a mut SeqState,
        toks: &'a [u32],
        logits: &'a mut [f32],
        trace: Option<&'a mut Trace>,
        hidden: Option<&'a mut [f32]>,
    ) -> Self {
        let (n, e, hc) = (toks.len(), m.hp.n_embd, m.hp.hc);
        CpuQwen4ExpChunk {
            m,
            st,
            toks,
            r: vec![0.0; n * hc * e],
            x: vec![0.0; n * e],
            y: vec![0.0; n * e],
            inj: vec![0.0; n * hc],
            logits,
            trace,
            hidden,
        }
    }

    /// The float order of this sequence's CPU run ([`SeqState::numerics`]).
    fn num(&self) -> Numerics {
        self.st.numerics
    }

    fn hc(&self, layer: usize, site: Site) -> &'a model::qwen4exp::HyperConn {
        let l = &self.m.layers[layer];
        match site {
            Site::Mixer => &l.hc_attn,
            Site::Ffn => &l.hc_ffn,
        }
    }
}

impl Qwen4ExpOps for CpuQwen4ExpChunk<'_> {
    fn embed(&mut self) -> Result<(), EngineError> {
        let (e, hc) = (self.m.hp.n_embd, self.m.hp.hc);
        let mut emb = vec![0f32; e];
        for (t, &tok) in self.toks.iter().enumerate() {
            self.m.tok_embd.get_row(tok as usize, &mut emb);
            for c in 0..hc {
                self.r[(t * hc + c) * e..(t * hc + c + 1) * e].copy_from_slice(&emb);
            }
        }
        Ok(())
    }

    fn ple(&mut self, layer: usize) -> Result<(), EngineError> {
        let num = self.num();
        if let (Some(ple), Some(ps)) = (&self.m.ple, self.st.ple.as_mut()) {
            ple.forward_with(num, &mut self.r, self.toks, ps).map_err(|reason| EngineError::Ple { layer, reason })?;
        }
        Ok(())
    }

    fn hc_mix(&mut self, layer: usize, site: Site) -> Result<(), EngineError> {
        self.hc(layer, site).mix_with(self.num(), &self.r, self.toks.len(), &mut self.x, Some(&mut self.inj));
        Ok(())
    }

    fn gdn(&mut self, layer: usize) -> Result<(), EngineError> {
        let (num, m) = (self.num(), self.m);
        // The device's windows run the recurrence token by token: so does the ordered mode.
        let mode = if num == Numerics::Ordered { GdnMode::Recurrent } else { m.gdn_mode };
        match (&m.layers[layer].mixer, &mut self.st.layers[layer]) {
            (Mixer::Gdn(g), LayerState::Gdn(gs)) => {
                g.forward_with(num, &self.x, self.toks.len(), gs, mode, &mut self.y)
            }
            _ => return Err(EngineError::StateMismatch { layer }),
        }
        Ok(())
    }

    fn attention(&mut self, layer: usize) -> Result<(), EngineError> {
        let (Mixer::Attn(a), LayerState::Attn(cache)) = (&self.m.layers[layer].mixer, &mut self.st.layers[layer])
        else {
            return Err(EngineError::StateMismatch { layer });
        };
        let want = self.trace.is_some() && a.indexer.is_some();
        let sel = a.forward_with(self.st.numerics, &self.x, self.toks.len(), self.st.pos, cache, &mut self.y, want);
        if let Some(tr) = self.trace.as_deref_mut().filter(|_| want) {
            match tr.qsa_selections.iter_mut().find(|(l, _)| *l == layer) {
                Some((_, v)) => v.extend(sel),
                None => tr.qsa_selections.push((layer, sel)),
            }
        }
        Ok(())
    }

    fn hc_combine(&mut self, layer: usize, site: Site) -> Result<(), EngineError> {
        self.hc(layer, site).combine_with(self.num(), &mut self.r, self.toks.len(), &self.y, &self.inj);
        Ok(())
    }

    fn moe(&mut self, layer: usize) -> Result<(), EngineError> {
        self.m.layers[layer].moe.forward_layer_with(self.num(), Some(layer), &self.x, self.toks.len(), &mut self.y);
        Ok(())
    }

    fn end_layer(&mut self, layer: usize) -> Result<(), EngineError> {
        if let Some(tr) = self.trace.as_deref_mut() {
            if tr.residuals.len() <= layer {
                tr.residuals.resize(layer + 1, Vec::new());
            }
            tr.residuals[layer].extend_from_slice(&self.r);
        }
        Ok(())
    }

    fn head(&mut self) -> Result<(), EngineError> {
        let n = self.toks.len();
        if let Some(h) = self.hidden.as_deref_mut() {
            h.copy_from_slice(&self.r);
        }
        let num = self.num();
        self.m.out_hc.mix_with(num, &self.r, n, &mut self.x, None);
        num.matmul(&self.m.output, &self.x, n, self.logits);
        Ok(())
    }
}
