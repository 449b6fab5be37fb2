//! The engine's NaN checks: logits that are not all finite are an error naming the position,
//! and with `STRATA_CHECK_FINITE=1` the first layer whose output held one.

use model::Logits;
use model::error::{EngineError, Result};

/// `STRATA_CHECK_FINITE=1`: scan the residual stream after every layer (read once).
pub(crate) fn check_layers() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("STRATA_CHECK_FINITE").is_ok_and(|v| v == "1"))
}

/// The first row of `logits` (rows of `n_vocab`; the last token's row for `Logits::Last`)
/// holding a NaN or an infinity is an error naming its position and token.
pub(crate) fn check_logits(logits: &[f32], n_vocab: usize, pos0: usize, tokens: &[u32], want: Logits) -> Result<()> {
    if n_vocab == 0 || logits.iter().all(|x| x.is_finite()) {
        return Ok(());
    }
    let first_row = if want == Logits::All { 0 } else { tokens.len().saturating_sub(1) };
    for (r, row) in logits.chunks(n_vocab).enumerate() {
        let count = row.iter().filter(|x| !x.is_finite()).count();
        if count > 0 {
            let i = (first_row + r).min(tokens.len().saturating_sub(1));
            return Err(EngineError::NonFinite {
                position: pos0 + i,
                token: tokens.get(i).copied().unwrap_or(0),
                layer: None,
                count,
                of: row.len(),
            });
        }
    }
    Ok(())
}

/// In a per-layer trace (`[layer][tokens * n_embd]`), the first layer holding a non-finite
/// value: (layer, token row, non-finite values in that row, row width).
pub(crate) fn first_non_finite_layer(trace: &[Vec<f32>], n_tokens: usize) -> Option<(usize, usize, usize, usize)> {
    trace.iter().enumerate().find_map(|(layer, x)| {
        let d = x.len() / n_tokens.max(1);
        if d == 0 {
            return None;
        }
        x.chunks(d).enumerate().find_map(|(row, v)| {
            let count = v.iter().filter(|x| !x.is_finite()).count();
            (count > 0).then_some((layer, row, count, d))
        })
    })
}
