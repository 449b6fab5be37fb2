//! The MTP (NextN) draft head on the CPU (its layout is described in `model::qwen4exp::mtp`).

use super::linear::{NumericsCpu, rms_norm};
use crate::prelude::*;
use model::error::EngineError;
use model::qwen4exp::mtp::MtpOut;
use model::qwen4exp::program::{self, Qwen4ExpOps, Site};
use model::qwen4exp::{HyperConn, Mtp, MtpState, Qwen4Exp};

/// The CPU executor's methods on [`Mtp`] (a type of the `model` crate, which knows no backend).
pub trait MtpCpu {
    /// Runs the pairs `(tokens[i], wide[i])` at positions `cells(st)..` (`wide [n][hc][E]`:
    /// the trunk's wide residual of the position before each token, or the head's own output
    /// `R'` when chaining). Logits for every pair (`all_logits`) or only the last. Runs on one
    /// thread team, like the trunk's micro-batches.
    fn forward(
        &self,
        model: &Qwen4Exp,
        st: &mut MtpState,
        tokens: &[u32],
        wide: &[f32],
        all_logits: bool,
    ) -> Result<MtpOut, EngineError>;
}

impl MtpCpu for Mtp {
    fn forward(
        &self,
        model: &Qwen4Exp,
        st: &mut MtpState,
        tokens: &[u32],
        wide: &[f32],
        all_logits: bool,
    ) -> Result<MtpOut, EngineError> {
        cpu_kernels::team::with_team(|| self.forward_on_team(model, st, tokens, wide, all_logits))
    }
}

/// Steps of the methods above that stay private to this module.
trait MtpSteps {
    fn forward_on_team(
        &self,
        model: &Qwen4Exp,
        st: &mut MtpState,
        tokens: &[u32],
        wide: &[f32],
        all_logits: bool,
    ) -> Result<MtpOut, EngineError>;
}

impl MtpSteps for Mtp {
    fn forward_on_team(
        &self,
        model: &Qwen4Exp,
        st: &mut MtpState,
        tokens: &[u32],
        wide: &[f32],
        all_logits: bool,
    ) -> Result<MtpOut, EngineError> {
        let (n, e, v, hc) = (tokens.len(), self.n_embd, self.n_vocab, self.hc);
        let w = self.width();
        let hp = &model.hp;
        if (hp.n_embd, hp.n_vocab, hp.n_layer, hp.hc) != (e, v, self.block, hc) {
            return Err(EngineError::MtpMismatch {
                key: "model (embedding, vocabulary, trunk layers, streams)".into(),
                mtp: format!("({e}, {v}, {}, {hc})", self.block),
                model: format!("({}, {}, {}, {})", hp.n_embd, hp.n_vocab, hp.n_layer, hp.hc),
            });
        }
        if let Some((index, &token)) = tokens.iter().enumerate().find(|(_, t)| **t as usize >= v) {
            return Err(EngineError::BadTokenAt { token, index, n_vocab: v });
        }
        if wide.len() != n * w {
            return Err(EngineError::MtpInput { got: wide.len(), tokens: n, width: w });
        }
        if n == 0 {
            return Ok(MtpOut { logits: Vec::new(), hidden: Vec::new() });
        }
        let start = self.cells(st);
        let first = if all_logits { 0 } else { n - 1 };
        let mut chunk = CpuMtpChunk {
            m: model,
            mtp: self,
            st,
            toks: tokens,
            wide,
            start,
            first,
            r: vec![0f32; n * w],
            x: vec![0f32; n * e],
            y: vec![0f32; n * e],
            inj: vec![0f32; n * hc],
            logits: vec![0f32; (n - first) * v],
        };
        program::mtp_forward(&mut chunk, self)?;
        let (logits, r) = (chunk.logits, chunk.r);
        Ok(MtpOut { logits, hidden: r })
    }
}

/// One micro-batch of the MTP head on the CPU: the operations of `program::mtp_forward` (layer
/// `mtp.block`) on the head's weights and cache.
struct CpuMtpChunk<'a> {
    m: &'a Qwen4Exp,
    mtp: &'a Mtp,
    st: &'a mut MtpState,
    toks: &'a [u32],
    /// The wide residuals `[n][hc][E]` paired with the tokens.
    wide: &'a [f32],
    /// Position of the first token; first row whose logits are wanted.
    start: usize,
    first: usize,
    /// The head's residual streams `[n][hc][E]` (its output `R'`), block input and output,
    /// injection logits, logits `[n - first][V]`.
    r: Vec<f32>,
    x: Vec<f32>,
    y: Vec<f32>,
    inj: Vec<f32>,
    logits: Vec<f32>,
}

impl<'a> CpuMtpChunk<'a> {
    fn hc(&self, layer: usize, site: Site) -> Result<&'a HyperConn, EngineError> {
        if layer != self.mtp.block {
            return Err(EngineError::StateMismatch { layer });
        }
        Ok(if site == Site::Mixer { &self.mtp.hc_attn } else { &self.mtp.hc_ffn })
    }

    fn only_head(op: &str) -> EngineError {
        EngineError::Unsupported(format!("the MTP head has no {op}"))
    }
}

impl Qwen4ExpOps for CpuMtpChunk<'_> {
    fn embed(&mut self) -> Result<(), EngineError> {
        Err(Self::only_head("trunk embedding"))
    }

    fn ple(&mut self, _layer: usize) -> Result<(), EngineError> {
        Err(Self::only_head("PLE block"))
    }

    fn gdn(&mut self, _layer: usize) -> Result<(), EngineError> {
        Err(Self::only_head("GDN layer"))
    }

    fn head(&mut self) -> Result<(), EngineError> {
        Err(Self::only_head("trunk head (it has mtp_head)"))
    }

    fn mtp_input(&mut self) -> Result<(), EngineError> {
        // One `[e ‖ hnorm_c(R_p[c])]` row per (token, stream): eh_proj maps every stream.
        let (n, e, hc, mtp) = (self.toks.len(), self.mtp.n_embd, self.mtp.hc, self.mtp);
        let embed = mtp.embed.as_ref().unwrap_or(&self.m.tok_embd);
        let mut cat = vec![0f32; n * hc * 2 * e];
        let (mut emb, mut en) = (vec![0f32; e], vec![0f32; e]);
        for t in 0..n {
            embed.get_row(self.toks[t] as usize, &mut emb);
            rms_norm(&emb, Some(&mtp.enorm), mtp.eps, &mut en);
            for c in 0..hc {
                let row = &mut cat[(t * hc + c) * 2 * e..][..2 * e];
                row[..e].copy_from_slice(&en);
                rms_norm(
                    &self.wide[(t * hc + c) * e..][..e],
                    Some(&mtp.hnorm[c * e..(c + 1) * e]),
                    mtp.eps,
                    &mut row[e..],
                );
            }
        }
        self.st.numerics.matmul(&mtp.eh_proj, &cat, n * hc, &mut self.r);
        Ok(())
    }

    fn hc_mix(&mut self, layer: usize, site: Site) -> Result<(), EngineError> {
        let num = self.st.numerics;
        self.hc(layer, site)?.mix_with(num, &self.r, self.toks.len(), &mut self.x, Some(&mut self.inj));
        Ok(())
    }

    fn attention(&mut self, layer: usize) -> Result<(), EngineError> {
        self.hc(layer, Site::Mixer)?;
        self.mtp.attn.forward_with(
            self.st.numerics,
            &self.x,
            self.toks.len(),
            self.start,
            &mut self.st.cache,
            &mut self.y,
            false,
        );
        Ok(())
    }

    fn hc_combine(&mut self, layer: usize, site: Site) -> Result<(), EngineError> {
        let num = self.st.numerics;
        self.hc(layer, site)?.combine_with(num, &mut self.r, self.toks.len(), &self.y, &self.inj);
        Ok(())
    }

    fn moe(&mut self, layer: usize) -> Result<(), EngineError> {
        self.hc(layer, Site::Ffn)?;
        self.mtp.moe.forward_layer_with(self.st.numerics, None, &self.x, self.toks.len(), &mut self.y);
        Ok(())
    }

    fn mtp_head(&mut self) -> Result<(), EngineError> {
        let (n, e, w) = (self.toks.len(), self.mtp.n_embd, self.mtp.width());
        let mixer = self.mtp.hc_head.as_ref().unwrap_or(&self.m.out_hc);
        let head = self.mtp.head.as_ref().unwrap_or(&self.m.output);
        let rows = n - self.first;
        let mut z = vec![0f32; rows * e];
        let num = self.st.numerics;
        mixer.mix_with(num, &self.r[self.first * w..], rows, &mut z, None);
        num.matmul(head, &z, rows, &mut self.logits);
        Ok(())
    }
}
