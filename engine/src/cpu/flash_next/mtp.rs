//! The MTP (NextN) draft head on the CPU (its layout is described in `model::qwen4exp::mtp`).

use super::linear::rms_norm;
use crate::cpu::prelude::*;
use crate::error::EngineError;
use crate::model::qwen4exp::mtp::MtpOut;
use crate::model::qwen4exp::{Mtp, MtpState, Qwen4Exp};

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
            return Err(EngineError::BadTokenAt {
                token,
                index,
                n_vocab: v,
            });
        }
        if wide.len() != n * w {
            return Err(EngineError::MtpInput {
                got: wide.len(),
                tokens: n,
                width: w,
            });
        }
        if n == 0 {
            return Ok(MtpOut {
                logits: Vec::new(),
                hidden: Vec::new(),
            });
        }
        // One `[e ‖ hnorm_c(R_p[c])]` row per (token, stream): eh_proj maps every stream.
        let embed = self.embed.as_ref().unwrap_or(&model.tok_embd);
        let mut cat = vec![0f32; n * hc * 2 * e];
        let (mut emb, mut en) = (vec![0f32; e], vec![0f32; e]);
        for t in 0..n {
            embed.get_row(tokens[t] as usize, &mut emb);
            rms_norm(&emb, Some(&self.enorm), self.eps, &mut en);
            for c in 0..hc {
                let row = &mut cat[(t * hc + c) * 2 * e..][..2 * e];
                row[..e].copy_from_slice(&en);
                rms_norm(
                    &wide[(t * hc + c) * e..][..e],
                    Some(&self.hnorm[c * e..(c + 1) * e]),
                    self.eps,
                    &mut row[e..],
                );
            }
        }
        let mut r = vec![0f32; n * w];
        self.eh_proj.matmul(&cat, n * hc, &mut r);

        let (mut x, mut y, mut inj) = (vec![0f32; n * e], vec![0f32; n * e], vec![0f32; n * hc]);
        self.hc_attn.mix(&r, n, &mut x, Some(&mut inj));
        let start = self.cells(st);
        self.attn
            .forward(&x, n, start, &mut st.cache, &mut y, false);
        self.hc_attn.combine(&mut r, n, &y, &inj);
        self.hc_ffn.mix(&r, n, &mut x, Some(&mut inj));
        self.moe.forward(&x, n, &mut y);
        self.hc_ffn.combine(&mut r, n, &y, &inj);

        let mixer = self.hc_head.as_ref().unwrap_or(&model.out_hc);
        let head = self.head.as_ref().unwrap_or(&model.output);
        let first = if all_logits { 0 } else { n - 1 };
        let rows = n - first;
        let mut z = vec![0f32; rows * e];
        mixer.mix(&r[first * w..], rows, &mut z, None);
        let mut logits = vec![0f32; rows * v];
        head.matmul(&z, rows, &mut logits);
        Ok(MtpOut { logits, hidden: r })
    }
}
