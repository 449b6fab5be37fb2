//! `GET /v1/status`: one JSON document for a monitor page: the engine's facts, the live state
//! (queue, tokens/s, running requests), the last requests, and the machine (CPU and RAM from
//! `/proc`, GPUs from Linux sysfs). Everything the server cannot know is `null`.

use crate::engine_process::EngineStatus;
use crate::http::{AppState, now};
use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;

pub async fn status(State(st): State<Arc<AppState>>) -> Response {
    let (state, error) = match st.engine.status() {
        EngineStatus::Ready(_) => ("ok", None),
        EngineStatus::Starting => ("loading", None),
        EngineStatus::Down { error, gave_up: true, .. } => ("failed", Some(error)),
        EngineStatus::Down { error, .. } => ("restarting", Some(error)),
    };
    let info = st.engine.info();
    let settings = info.as_ref().and_then(|i| i.engine.clone());
    let setting = |key: &str| settings.as_ref().and_then(|s| s.get(key)).cloned();
    let expert_cache_slots = setting("expert_cache_slots")
        .or_else(|| settings.as_ref()?.pointer("/gpu/expert_cache").cloned())
        .filter(|v| !v.is_null());
    let engine = json!({
        "status": state, "error": error, "model": st.model_name(),
        "engine_model": info.as_ref().map(|i| i.name.clone()),
        "arch": st.arch, "backend": setting("backend"), "device": setting("device"),
        "kv_type": setting("kv"), "threads": setting("threads"),
        "context_length": info.as_ref().map(|i| i.context_length),
        "vocab_size": info.as_ref().map(|i| i.vocab_size),
        "parallel": info.as_ref().map(|i| i.parallel),
        "expert_cache_slots": expert_cache_slots, "pid": st.engine.engine_pid(),
        "settings": settings,
    });
    let uptime = now().saturating_sub(st.created);
    Json(json!({
        "server": {"version": env!("CARGO_PKG_VERSION"), "started": st.created, "uptime_seconds": uptime},
        "engine": engine,
        "live": st.metrics.live_json(),
        "recent": st.metrics.recent_json(),
        "machine": machine(Path::new("/")),
    }))
    .into_response()
}

/// The machine under `root` (`/` in the server; a fake tree in tests).
pub fn machine(root: &Path) -> Value {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    let cpu = read("proc/cpuinfo").map(|t| parse_cpuinfo(&t));
    let (model, logical) = cpu.unwrap_or((None, None));
    let mem = read("proc/meminfo").map(|t| parse_meminfo(&t));
    let (total, available) = mem.unwrap_or((None, None));
    let usable = (root == Path::new("/")).then(|| std::thread::available_parallelism().ok().map(|n| n.get())).flatten();
    json!({
        "cpu": {"model": model, "logical_cpus": logical, "usable_cpus": usable},
        "memory": {"total_bytes": total, "available_bytes": available},
        "gpus": gpus(root),
    })
}

/// (model name, logical CPUs) from `/proc/cpuinfo`.
pub fn parse_cpuinfo(text: &str) -> (Option<String>, Option<usize>) {
    let mut model = None;
    let mut n = 0;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        if k == "processor" {
            n += 1;
        }
        // x86 says `model name`; some ARM kernels only `Hardware` or `cpu model` (MIPS).
        if model.is_none() && matches!(k, "model name" | "Hardware" | "cpu model") && !v.is_empty() {
            model = Some(v.to_string());
        }
    }
    (model, (n > 0).then_some(n))
}

/// (MemTotal, MemAvailable) in bytes from `/proc/meminfo` (its values are in kB).
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix(':')?;
            let kb: u64 = rest.split_whitespace().next()?.parse().ok()?;
            kb.checked_mul(1024)
        })
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// Cards under `sys/class/drm` (`cardN`, not their connectors) with any of the amdgpu files
/// `mem_info_vram_total`, `mem_info_vram_used`, `gpu_busy_percent`; a missing or unreadable
/// file is `null`.
pub fn gpus(root: &Path) -> Vec<Value> {
    let Ok(dir) = std::fs::read_dir(root.join("sys/class/drm")) else {
        return Vec::new();
    };
    let mut cards: Vec<(u32, String)> = dir
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let n = name.strip_prefix("card")?.parse().ok()?;
            Some((n, name))
        })
        .collect();
    cards.sort();
    cards
        .into_iter()
        .filter_map(|(_, name)| {
            let dev = root.join("sys/class/drm").join(&name).join("device");
            let num = |f: &str| -> Option<u64> { std::fs::read_to_string(dev.join(f)).ok()?.trim().parse().ok() };
            let (total, used, busy) = (num("mem_info_vram_total"), num("mem_info_vram_used"), num("gpu_busy_percent"));
            if total.is_none() && used.is_none() && busy.is_none() {
                return None;
            }
            Some(json!({"card": name, "vram_total_bytes": total, "vram_used_bytes": used,
                        "busy_percent": busy.filter(|&b| b <= 100)}))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpuinfo_and_meminfo() {
        let cpu = "processor\t: 0\nmodel name\t: AMD Ryzen 9 7950X 16-Core Processor\n\nprocessor\t: 1\nmodel name\t: AMD Ryzen 9 7950X 16-Core Processor\n";
        assert_eq!(parse_cpuinfo(cpu), (Some("AMD Ryzen 9 7950X 16-Core Processor".into()), Some(2)));
        assert_eq!(parse_cpuinfo("garbage\n:\n"), (None, None));
        let mem = "MemTotal:       65536 kB\nMemFree:  1 kB\nMemAvailable:   32768 kB\n";
        assert_eq!(parse_meminfo(mem), (Some(65536 * 1024), Some(32768 * 1024)));
        assert_eq!(parse_meminfo("MemTotal: lots kB\n"), (None, None));
    }

    #[test]
    fn sysfs_gpus_parsed_defensively() {
        let root = std::env::temp_dir().join(format!("strata-status-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let drm = root.join("sys/class/drm");
        for (card, files) in [
            (
                "card1",
                &[
                    ("mem_info_vram_total", "25753026560\n"),
                    ("mem_info_vram_used", "1048576\n"),
                    ("gpu_busy_percent", "37\n"),
                ][..],
            ),
            ("card0", &[("mem_info_vram_total", "garbage")][..]),
            ("card1-DP-1", &[("gpu_busy_percent", "5")][..]),
            ("card2", &[][..]),
        ] {
            let dev = drm.join(card).join("device");
            std::fs::create_dir_all(&dev).unwrap();
            for (f, v) in files {
                std::fs::write(dev.join(f), v).unwrap();
            }
        }
        // card0's only file is unparsable and card2 has none: neither is listed; the
        // connector is not a card.
        let g = gpus(&root);
        assert_eq!(g.len(), 1, "{g:?}");
        assert_eq!(g[0]["card"], "card1");
        assert_eq!(g[0]["vram_total_bytes"], 25753026560u64);
        assert_eq!(g[0]["vram_used_bytes"], 1048576);
        assert_eq!(g[0]["busy_percent"], 37);
        let m = machine(&root);
        assert_eq!(m["cpu"]["model"], Value::Null);
        assert_eq!(m["memory"]["total_bytes"], Value::Null);
        assert!(gpus(&root.join("nope")).is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
