// The Monitor: polls /v1/status every second and shows the engine's facts, the live state,
// the last requests and the machine.

import { apiFetch, bindKeyInput, el, errorText, fmt, fmtBytes } from "./common.js";

const $ = (id) => document.getElementById(id);
const history = []; // tokens/s of the last polls, for the chart
const HISTORY = 120;
let timer = null;

function set(id, v) { $(id).textContent = v; }

function row(cells) {
  const tr = el("tr");
  for (const c of cells) tr.appendChild(el("td", null, c));
  return tr;
}

function pair(a, b) { return a === null && b === null ? "–" : fmt(a) + " / " + fmt(b); }

function show(s) {
  const e = s.engine || {};
  for (const k of ["model", "engine_model", "arch", "context_length", "kv_type", "threads", "parallel", "expert_cache_slots", "pid"]) set("engine-" + k, fmt(e[k]));
  set("engine-status", e.error ? e.status + " (" + e.error + ")" : fmt(e.status));
  set("engine-device", fmt(e.backend) + " / " + fmt(e.device));
  const srv = s.server || {};
  set("server", "strata " + fmt(srv.version) + ", up " + fmt(srv.uptime_seconds) + " s");
  const st = $("state");
  st.textContent = fmt(e.status);
  st.className = "badge " + (e.status === "ok" ? "ok" : "warn");

  const l = s.live || {};
  set("live-tps", fmt(l.tokens_per_second, 1) + " (over " + fmt(l.window_seconds) + " s)");
  set("live-queue", fmt(l.requests_waiting) + " / " + fmt(l.requests_in_flight));
  set("live-restarts", fmt(l.engine_restarts));
  const r = l.reported || {};
  set("live-hits", pair(r.expert_cache_hits, r.expert_cache_lookups));
  set("live-drafts", pair(r.draft_accepted, r.draft_offered));
  const running = l.running || [];
  $("running").replaceChildren(...(running.length ? [] : [row(["–", "idle", "", "", "", "", ""])]), ...running.map((q) => row([
    q.id, q.endpoint, q.phase + (q.prompt_progress !== null && q.prompt_progress !== undefined ? " " + fmt(q.prompt_progress * 100, 0) + "%" : ""),
    q.prompt_tokens, q.generated_tokens, fmt(q.elapsed_ms, 0) + " ms", fmt(q.queue_ms, 1) + " ms",
  ])));
  history.push(l.tokens_per_second || 0);
  if (history.length > HISTORY) history.shift();
  chart();

  $("recent").replaceChildren(...(s.recent || []).slice().reverse().map((q) => row([
    q.id, q.endpoint, fmt(q.status), q.finish, fmt(q.prompt_tokens), fmt(q.completion_tokens),
    fmt(q.queue_ms, 1), fmt(q.prompt_ms, 1), fmt(q.decode_ms, 1), fmt(q.prompt_per_second, 1), fmt(q.decode_per_second, 1),
    pair(q.expert_cache_hits, q.expert_cache_lookups), pair(q.draft_accepted, q.draft_offered),
    q.finished_at ? new Date(q.finished_at * 1000).toLocaleTimeString() : "–",
  ])));

  const m = s.machine || {};
  const cpu = m.cpu || {}, mem = m.memory || {};
  set("machine-cpu", fmt(cpu.model));
  set("machine-cpus", fmt(cpu.logical_cpus) + " / " + fmt(cpu.usable_cpus));
  const used = mem.total_bytes != null && mem.available_bytes != null ? mem.total_bytes - mem.available_bytes : null;
  set("machine-ram", fmtBytes(used) + " / " + fmtBytes(mem.total_bytes));
  const gpus = m.gpus || [];
  $("gpus").replaceChildren(...(gpus.length ? gpus.map((g) => row([
    g.card, fmtBytes(g.vram_used_bytes) + " / " + fmtBytes(g.vram_total_bytes), g.busy_percent == null ? "–" : g.busy_percent + " %",
  ])) : [row(["none found", "", ""])]));
  set("updated", "updated " + new Date().toLocaleTimeString());
}

function chart() {
  const c = $("tps-chart");
  if (c.clientWidth && c.width !== c.clientWidth) c.width = c.clientWidth; // sharp, not stretched
  const g = c.getContext("2d");
  const w = c.width, h = c.height;
  g.clearRect(0, 0, w, h);
  const max = Math.max(1, ...history);
  g.strokeStyle = "#3b82f6";
  g.lineWidth = 2;
  g.beginPath();
  history.forEach((v, i) => {
    const x = (i / (HISTORY - 1)) * w, y = h - 4 - (v / max) * (h - 8);
    if (i) g.lineTo(x, y); else g.moveTo(x, y);
  });
  g.stroke();
  g.fillStyle = "#888";
  g.font = "11px sans-serif";
  g.fillText("max " + max.toFixed(1) + " tok/s", 4, 12);
}

function error(text) {
  const e = $("error");
  e.textContent = text || "";
  e.hidden = !text;
}

async function poll() {
  clearTimeout(timer);
  try {
    const r = await apiFetch("/v1/status", { cache: "no-store" });
    if (!r.ok) error(await errorText(r));
    else { show(await r.json()); error(""); }
  } catch (e) {
    error("server unreachable: " + (e.message || e));
  }
  timer = setTimeout(poll, 1000);
}

bindKeyInput($("api-key"), poll);
poll();
