//! PLE rows read while the device runs a decode window (issue 15, PLE). A token's 16 n-gram
//! rows are known only once the token is, and they are read from a 29 GB table on the SSD; the
//! device needs them only at the PLE layer. So a window's launches (or its graph) start at
//! once, the stream waits at the PLE layer on a mapped [`Mailbox`], and a host thread reads the
//! rows (`Ple::read_rows`: row cache, direct I/O) and rings: the read overlaps the layers before
//! the PLE layer, and the graph stays one launch per window. Prompt chunks keep gathering the
//! next chunk's rows while the current one runs (`GpuQwen4ExpChunk::gather_next`).

use std::sync::atomic::AtomicBool;

use super::super::device::{DevicePtr, GpuApi, GpuError, Mailbox, Stream, handoff};
use cpu_executor::qwen4exp::team_for_each;
use model::error::{EngineError, Result};
use model::qwen4exp::Ple;

pub(super) struct PleFeed {
    mailbox: Mailbox,
}

impl PleFeed {
    /// A feed for windows of up to `window` tokens of `n_embd` rows.
    pub fn new(api: &dyn GpuApi, window: usize, n_embd: usize) -> std::result::Result<PleFeed, GpuError> {
        Ok(PleFeed { mailbox: Mailbox::new(api, window * n_embd * 4)? })
    }

    /// Device side (capturable): waits for the rows of `n` tokens and copies them to `emb`.
    pub fn receive(
        &self,
        api: &dyn GpuApi,
        st: &Stream,
        emb: DevicePtr,
        n: usize,
        n_embd: usize,
    ) -> std::result::Result<(), GpuError> {
        self.mailbox.device_recv(api, st, emb, n * n_embd * 4)
    }

    /// Runs `device` (the window's launches, which [`PleFeed::receive`] the rows) while a
    /// thread reads `rows` (from `Ple::row_ids`) and sends them. A failed read still answers
    /// (zero rows, so the device goes on) and is the result; after any failure the mailbox is
    /// reset for the next window.
    pub fn run<R>(
        &self,
        api: &dyn GpuApi,
        st: &Stream,
        ple: &Ple,
        rows: &[usize],
        device: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        let layer = ple.params.layer;
        let read = |cancel: &AtomicBool| {
            let (bytes, result) = match ple.read_rows(rows, team_for_each) {
                Ok(emb) => (emb.iter().flat_map(|v| v.to_le_bytes()).collect(), Ok(())),
                Err(reason) => (
                    vec![0u8; rows.len() / ple.params.n_heads().max(1) * ple.n_embd * 4],
                    Err(EngineError::Ple { layer, reason }),
                ),
            };
            self.mailbox
                .host_send_until(api, &bytes, Some(cancel))
                .map_err(|e| EngineError::Gpu(format!("qwen4exp PLE rows: {e}")))?;
            result
        };
        let (r, read) = handoff::alongside(api, st, "strata-ple", read, device)
            .unwrap_or_else(|why| (Err(EngineError::Gpu(format!("qwen4exp PLE rows: {why}"))), Ok(())));
        if r.is_err() || read.is_err() {
            let _ = api.stream_synchronize(st);
            self.mailbox.reset(api).map_err(|e| EngineError::Gpu(format!("qwen4exp PLE rows: {e}")))?;
        }
        let r = r?;
        read?;
        Ok(r)
    }

    pub fn free(self, api: &dyn GpuApi) -> std::result::Result<(), GpuError> {
        self.mailbox.free(api)
    }
}
