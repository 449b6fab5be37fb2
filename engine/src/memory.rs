//! The memory plan of a session, computed from the model description before anything is
//! allocated: `--max-context 100000000` used to abort the process in a 38 GB allocation, and
//! `--max-context 18446744073709551615` in a capacity overflow (issue 39). A context that does
//! not fit is refused at load, with the numbers, so `--serve` and `strata server` say why
//! instead of restarting an engine that dies.

use model::KvType;
use model::error::EngineError;

/// What a session of `positions` cells needs for its KV cache.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionPlan {
    pub positions: usize,
    /// The positions are the model's training context (`--max-context 0`), not a flag's.
    pub from_training: bool,
    pub kv: KvType,
    /// KV bytes one position takes across every layer (None: the size overflows).
    pub kv_per_position: Option<u64>,
}

impl SessionPlan {
    /// The KV cache's total bytes (None: it overflows 64 bits).
    pub fn kv_bytes(&self) -> Option<u64> {
        self.kv_per_position?.checked_mul(self.positions as u64)
    }

    /// Refuses a plan that overflows, or whose cache does not fit in `available` bytes (the
    /// memory it would live in; None: unknown, only overflow is checked).
    pub fn check(&self, available: Option<u64>) -> Result<(), EngineError> {
        let kv = self.kv.name();
        let n = if self.from_training {
            format!("0 (the model's training context, {} positions)", self.positions)
        } else {
            self.positions.to_string()
        };
        let Some(total) = self.kv_bytes() else {
            return Err(EngineError::Memory(format!(
                "--max-context {n}: the KV cache's size overflows (a position takes {} bytes with --kv {kv}); give a context the machine can hold",
                self.kv_per_position.map_or("more than 2^64".to_string(), |b| b.to_string())
            )));
        };
        let (Some(avail), Some(per)) = (available, self.kv_per_position) else { return Ok(()) };
        if total <= avail {
            return Ok(());
        }
        let fits = avail / per.max(1);
        let int8 = if self.kv == KvType::Int8 { String::new() } else { " or --kv int8".to_string() };
        Err(EngineError::Memory(format!(
            "--max-context {n} does not fit: the KV cache needs {} ({} a position, --kv {kv}) but {} of memory is available; at most {fits} positions fit (lower --max-context{int8})",
            human(total),
            human(per),
            human(avail),
        )))
    }
}

/// Bytes for a person: "38.4 GB", "384.0 KB".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KB", "MB", "GB", "TB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 { format!("{bytes} B") } else { format!("{v:.1} {}", UNITS[u]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plan_that_overflows_or_does_not_fit_is_refused_with_its_numbers() {
        let plan =
            |positions, per| SessionPlan { positions, from_training: false, kv: KvType::F16, kv_per_position: per };
        assert!(plan(4096, Some(12_288)).check(Some(1 << 30)).is_ok());
        assert!(plan(4096, Some(12_288)).check(None).is_ok());
        let e = plan(usize::MAX, Some(12_288)).check(None).unwrap_err().to_string();
        assert!(e.contains("overflows"), "{e}");
        let e = plan(100_000_000, Some(384_000)).check(Some(21_500_000_000)).unwrap_err().to_string();
        assert!(e.contains("needs 38.4 TB") && e.contains("384.0 KB a position") && e.contains("21.5 GB"), "{e}");
        assert!(e.contains("at most 55989 positions fit"), "{e}");
        let trained =
            SessionPlan { positions: 1 << 32, from_training: true, kv: KvType::Int8, kv_per_position: Some(1024) };
        let e = trained.check(Some(1 << 30)).unwrap_err().to_string();
        assert!(
            e.starts_with("--max-context 0 (the model's training context, 4294967296 positions) does not fit"),
            "{e}"
        );
        assert!(e.contains("(lower --max-context)"), "{e}");
    }
}
