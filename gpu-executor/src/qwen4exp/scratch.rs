//! The buffers of one Flash-Next sequence's windows and prompt chunks on the device
//! ([`Scratch`]): every activation of the program for the most tokens one evaluation step
//! takes (a window of [`super::WINDOW`], or a prompt chunk of up to [`super::PREFILL_MAX`]),
//! and, for prompt chunks, the dequantize + GEMM staging and the chunked delta rule's scratch.

use super::GpuQwen4Exp;
use crate::device::DevicePtr;
use crate::upload::{Uploader, q8_1_bytes};
use model::error::Result;
use model::qwen4exp::{Mixer, Mtp, Qwen4Exp};

/// The session's device buffers for one evaluation step of up to `cols` tokens (f32 row-major
/// `[cols][..]` unless stated).
pub(super) struct Scratch {
    /// Most tokens of one step: [`super::WINDOW`], or the session's prompt chunk.
    pub(super) cols: usize,
    /// Token ids and positions of the window (u32).
    pub(super) ids: DevicePtr,
    pub(super) pos: DevicePtr,
    /// The residual streams `[hc][E]` a token, the block input and output, the injection logits.
    pub(super) r: DevicePtr,
    pub(super) x: DevicePtr,
    pub(super) y: DevicePtr,
    pub(super) inj: DevicePtr,
    /// Q8_1 activations and the f16 copy (f16 / bf16 weights) of the widest product input.
    pub(super) xq: DevicePtr,
    pub(super) xh: DevicePtr,
    /// Prompt chunks: a layer matrix dequantized to f16 for the GEMM path (`Tmp::wdq`, the
    /// shared decoder's rule in `gpu::linear`) and its size in f32 bytes (0 and 0 for windows).
    pub(super) wdq: DevicePtr,
    pub(super) wdq_bytes: usize,
    /// Prompt chunks: the chunked delta rule's scratch `[Hv][2·GDN_CHUNK_MAX][S]` (0 for
    /// windows).
    pub(super) gdn_delta: DevicePtr,
    /// Prompt chunks: one routed expert's gathered inputs `[cols][E]` (host-readback experts,
    /// each on all its tokens at once; 0 for windows).
    pub(super) xg: DevicePtr,
    /// Ordered mode: the widest input quantized to a weight's `vec_dot_type` (0 otherwise).
    pub(super) xo: DevicePtr,
    /// GR read: normed streams, low-rank activations, gates.
    pub(super) flat: DevicePtr,
    pub(super) lo: DevicePtr,
    pub(super) gates: DevicePtr,
    /// GDN: projections (conv input, gate, β, α), conv output, mixer output.
    pub(super) m: DevicePtr,
    pub(super) z: DevicePtr,
    pub(super) beta: DevicePtr,
    pub(super) alpha: DevicePtr,
    pub(super) u: DevicePtr,
    pub(super) o: DevicePtr,
    /// QSA: projections, normed q / k / indexer queries, block scores, kept cells (u32) and
    /// counts, the gated attention.
    pub(super) qf: DevicePtr,
    pub(super) kp: DevicePtr,
    pub(super) vp: DevicePtr,
    pub(super) kappa_p: DevicePtr,
    pub(super) iq_p: DevicePtr,
    pub(super) q: DevicePtr,
    pub(super) k: DevicePtr,
    pub(super) iq: DevicePtr,
    pub(super) score: DevicePtr,
    pub(super) sel: DevicePtr,
    pub(super) sel_n: DevicePtr,
    pub(super) att: DevicePtr,
    /// MoE: router logits, expert ids (u32) and weights, expert outputs `[cols·k][E]`, their
    /// row map (u32, `0..cols·k`), one expert's gate / up / activation, the shared expert's,
    /// its output and gate logit.
    pub(super) rlog: DevicePtr,
    pub(super) rids: DevicePtr,
    pub(super) rw: DevicePtr,
    pub(super) ys: DevicePtr,
    pub(super) map: DevicePtr,
    /// The handoff path (`crate::experts::handoff`): each slot's cache slot, and the combine's
    /// rows (`ys` holds `2·cols·k` rows: the device's, then the host's).
    pub(super) rslots: DevicePtr,
    pub(super) hmap: DevicePtr,
    /// A prompt chunk's slots ordered by expert (device dispatch of more than a window).
    pub(super) order: crate::linear::SlotOrder,
    pub(super) eg: DevicePtr,
    pub(super) eu: DevicePtr,
    pub(super) ea: DevicePtr,
    /// Device dispatch (`mmvq_moe_*`): every slot's gate and up (unfused types), activation,
    /// and its Q8_1 form `[cols·k][ff]`.
    pub(super) dg: DevicePtr,
    pub(super) du: DevicePtr,
    pub(super) da: DevicePtr,
    pub(super) daq: DevicePtr,
    pub(super) shg: DevicePtr,
    pub(super) shu: DevicePtr,
    pub(super) sha: DevicePtr,
    pub(super) sh: DevicePtr,
    pub(super) shgate: DevicePtr,
    /// PLE: gathered rows, key / value projections, gated value and its norm.
    pub(super) emb: DevicePtr,
    pub(super) pkey: DevicePtr,
    pub(super) pval: DevicePtr,
    pub(super) gv: DevicePtr,
    pub(super) nn: DevicePtr,
    /// MTP head: the wide residuals given with the tokens `[hc][E]`, one stream's
    /// `[enorm(e) ‖ hnorm_c(R_p[c])]` rows `[2E]`, their projection `[E]`.
    pub(super) wide: DevicePtr,
    pub(super) cat: DevicePtr,
    pub(super) proj: DevicePtr,
    /// The head's logits `[logit_rows()][n_vocab]` (a longer chunk's head runs in passes).
    pub(super) logits: DevicePtr,
    /// MTP head: the last row's greedy token and probability (`logits_top`), 2 u32.
    pub(super) top: DevicePtr,
}

impl Scratch {
    /// Rows the logits buffer holds: the step's tokens up to one pass of the head.
    pub(super) fn logit_rows(&self) -> usize {
        self.cols.min(super::prompt::LOGIT_ROWS)
    }

    /// Buffers for steps of up to `cols` tokens of the trunk of `g` (a prompt chunk when
    /// `cols` is more than a window), and of the MTP `head` if given.
    pub(super) fn new(
        up: &mut Uploader,
        g: &GpuQwen4Exp,
        capacity: usize,
        head: Option<&Mtp>,
        cols: usize,
    ) -> Result<Scratch> {
        let m: &Qwen4Exp = &g.m;
        let (e, hc, w) = (m.hp.n_embd, m.hp.hc, cols.max(super::WINDOW));
        let hce = hc * e;
        let lr = m
            .out_hc
            .down
            .rows
            .max(m.layers.iter().map(|l| l.hc_attn.down.rows.max(l.hc_ffn.down.rows)).max().unwrap_or(1));
        let (mut c, mut vd, mut hv, mut qf, mut kvd, mut hd, mut idim, mut iqd, mut blocks, mut budget) =
            (1, 1, 1, 1, 1, 1, 1, 1, 1, 1);
        let (mut ne, mut k, mut ff, mut ffs) = (1, 1, 1, 1);
        // (GDN, attention, MoE) of every layer, the head's block included.
        let trunk = m.layers.iter().map(|l| match &l.mixer {
            Mixer::Gdn(gd) => (Some(gd), None, &l.moe),
            Mixer::Attn(a) => (None, Some(a), &l.moe),
        });
        for (gdn, attn, moe) in trunk.chain(head.map(|h| (None, Some(&h.attn), &h.moe))) {
            match (gdn, attn) {
                (Some(gd), _) => {
                    c = c.max(gd.channels());
                    vd = vd.max(gd.hv * gd.s);
                    hv = hv.max(gd.hv);
                }
                (_, Some(a)) => {
                    qf = qf.max(2 * a.n_head * a.head_dim);
                    kvd = kvd.max(a.n_head_kv * a.head_dim);
                    hd = hd.max(a.n_head * a.head_dim);
                    if let Some(ix) = &a.indexer {
                        idim = idim.max(ix.dim);
                        iqd = iqd.max(ix.heads * ix.dim);
                        blocks = blocks.max(capacity / ix.ratio);
                        budget = budget.max(ix.top_k + ix.ratio - 1);
                    }
                }
                _ => {}
            }
            ne = ne.max(moe.experts.len());
            k = k.max(moe.spec.n_expert_used);
            ff = ff.max(moe.experts.iter().map(|x| x.gate.rows).max().unwrap_or(1));
            ffs = ffs.max(moe.shared.gate.rows);
        }
        let lr = head.map_or(lr, |h| {
            [&h.hc_attn, &h.hc_ffn].into_iter().chain(&h.hc_head).map(|x| x.down.rows).fold(lr, usize::max)
        });
        let widest = [e, 2 * e, hce, lr, vd, hd, ff, ffs].into_iter().max().unwrap_or(e).next_multiple_of(32);
        let f = |up: &mut Uploader, n: usize| up.zeroed(n * 4);
        let map: Vec<u32> = (0..(w * k) as u32).collect();
        let prompt = w > super::WINDOW;
        let wdq_bytes = if prompt { super::prompt::dequant_scratch_bytes(&g.w) } else { 0 };
        Ok(Scratch {
            cols: w,
            wdq: if wdq_bytes > 0 { up.zeroed(wdq_bytes)? } else { 0 },
            wdq_bytes,
            gdn_delta: if prompt { f(up, 2 * vd * crate::abi::GDN_CHUNK_MAX as usize)? } else { 0 },
            xg: if prompt { f(up, w * e)? } else { 0 },
            ids: f(up, w)?,
            pos: f(up, w)?,
            r: f(up, w * hce)?,
            x: f(up, w * e)?,
            y: f(up, w * e)?,
            inj: f(up, w * hc)?,
            xq: up.zeroed(w * q8_1_bytes(widest))?,
            xh: up.zeroed(w * widest * 2)?,
            // 4 bytes a value hold any `vec_dot_type` (f32 is the widest).
            xo: if g.res.opts.ordered { up.zeroed(w * widest * 4)? } else { 0 },
            flat: f(up, w * hce)?,
            lo: f(up, w * lr)?,
            gates: f(up, w * hce)?,
            m: f(up, w * c)?,
            z: f(up, w * vd)?,
            beta: f(up, w * hv)?,
            alpha: f(up, w * hv)?,
            u: f(up, w * c)?,
            o: f(up, w * vd)?,
            qf: f(up, w * qf)?,
            kp: f(up, w * kvd)?,
            vp: f(up, w * kvd)?,
            kappa_p: f(up, w * idim)?,
            iq_p: f(up, w * iqd)?,
            q: f(up, w * hd)?,
            k: f(up, w * kvd)?,
            iq: f(up, w * iqd)?,
            score: f(up, w * blocks)?,
            sel: f(up, w * budget)?,
            sel_n: f(up, w)?,
            att: f(up, w * hd)?,
            rlog: f(up, w * ne)?,
            rids: f(up, w * k)?,
            rw: f(up, w * k)?,
            ys: f(up, 2 * w * k * e)?,
            map: up.bytes(&map.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>())?,
            rslots: f(up, w * k)?,
            hmap: f(up, w * k)?,
            order: crate::linear::SlotOrder::alloc(up, w * k)?,
            eg: f(up, ff)?,
            eu: f(up, ff)?,
            ea: f(up, ff)?,
            dg: f(up, w * k * ff)?,
            du: f(up, w * k * ff)?,
            da: f(up, w * k * ff)?,
            daq: up.zeroed(w * k * q8_1_bytes(ff.next_multiple_of(32)))?,
            shg: f(up, w * ffs)?,
            shu: f(up, w * ffs)?,
            sha: f(up, w * ffs)?,
            sh: f(up, w * e)?,
            shgate: f(up, w)?,
            emb: f(up, w * e)?,
            pkey: f(up, w * hce)?,
            pval: f(up, w * e)?,
            gv: f(up, w * hce)?,
            nn: f(up, w * hce)?,
            wide: f(up, if head.is_some() { w * hce } else { 1 })?,
            cat: f(up, if head.is_some() { w * 2 * e } else { 1 })?,
            proj: f(up, if head.is_some() { w * e } else { 1 })?,
            logits: f(up, w.min(super::prompt::LOGIT_ROWS) * m.hp.n_vocab)?,
            top: f(up, 2)?,
        })
    }
}
