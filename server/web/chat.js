// The chat page: conversations in localStorage, answers streamed from /v1/chat/completions
// (SSE read with fetch + ReadableStream), a stop button (AbortController), sampling settings.

import { apiFetch, bindKeyInput, copyButton, el, errorText } from "./common.js";
import { renderMarkdown } from "./markdown.js";

const STORE = "strata.conversations";
const CURRENT = "strata.current";
const SETTINGS = "strata.settings";
const $ = (id) => document.getElementById(id);

let convs = load(STORE, []);
let current = localStorage.getItem(CURRENT);
let controller = null; // the AbortController of the answer being streamed

function load(key, dflt) {
  try { return JSON.parse(localStorage.getItem(key)) ?? dflt; } catch (_) { return dflt; }
}
function save() {
  localStorage.setItem(STORE, JSON.stringify(convs));
  if (current) localStorage.setItem(CURRENT, current);
}
function conv() { return convs.find((c) => c.id === current); }

function newConversation() {
  const c = { id: String(Date.now()) + Math.random().toString(16).slice(2, 6), title: "New chat", messages: [], updated: Date.now() };
  convs.unshift(c);
  current = c.id;
  save();
  render();
}

function renderList() {
  const ul = $("conversations");
  ul.replaceChildren();
  for (const c of convs) {
    const li = el("li", c.id === current ? "active" : null);
    const open = el("button", "title", c.title);
    open.type = "button";
    open.addEventListener("click", () => { if (!controller) { current = c.id; save(); render(); } });
    const del = el("button", "delete", "×");
    del.type = "button";
    del.title = "Delete conversation";
    del.addEventListener("click", () => {
      if (controller && c.id === current) return;
      convs = convs.filter((x) => x.id !== c.id);
      if (current === c.id) current = convs[0]?.id ?? null;
      save();
      if (!current) newConversation(); else render();
    });
    li.append(open, del);
    ul.appendChild(li);
  }
}

// One message's element; `msg.state`: undefined (done), "streaming", "stopped", "error".
function messageEl(msg) {
  const div = el("div", "msg " + msg.role);
  const head = el("div", "msghead");
  head.appendChild(el("span", "role", msg.role === "user" ? "You" : "Assistant"));
  head.appendChild(copyButton(() => msg.content));
  const body = el("div", "body");
  if (msg.role === "assistant") body.appendChild(renderMarkdown(msg.content));
  else body.textContent = msg.content;
  div.append(head, body);
  if (msg.note) div.appendChild(el("div", "note", msg.note));
  return div;
}

function renderMessages() {
  const box = $("messages");
  box.replaceChildren();
  const c = conv();
  if (!c) return;
  for (const m of c.messages) box.appendChild(messageEl(m));
  box.scrollTop = box.scrollHeight;
}

function render() { renderList(); renderMessages(); }

function settings() {
  const num = (id) => { const v = parseFloat($(id).value); return Number.isFinite(v) ? v : undefined; };
  return { temperature: num("temperature"), top_p: num("top_p"), max_tokens: num("max_tokens") && Math.round(num("max_tokens")), system: $("system").value };
}
function saveSettings() { localStorage.setItem(SETTINGS, JSON.stringify(settings())); }
function loadSettings() {
  const s = load(SETTINGS, {});
  for (const k of ["temperature", "top_p", "max_tokens", "system"]) if (s[k] !== undefined) $(k).value = s[k];
}

function showError(text) {
  const e = $("error");
  e.textContent = text || "";
  e.hidden = !text;
}

// Parse an SSE byte stream; calls onData with each `data:` payload.
async function readSse(body, onData) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data && onData(data) === false) return;
    }
  }
}

async function send(text) {
  const c = conv();
  if (!c || controller) return;
  showError("");
  c.messages.push({ role: "user", content: text });
  if (c.title === "New chat") c.title = text.slice(0, 40);
  const answer = { role: "assistant", content: "" };
  c.messages.push(answer);
  c.updated = Date.now();
  save();
  render();
  const box = $("messages");
  const node = box.lastElementChild;
  node.classList.add("streaming");
  const bodyEl = node.querySelector(".body");

  const s = settings();
  const messages = [];
  if (s.system.trim()) messages.push({ role: "system", content: s.system });
  for (const m of c.messages.slice(0, -1)) if (m.content) messages.push({ role: m.role, content: m.content });
  const req = { messages, stream: true };
  for (const k of ["temperature", "top_p", "max_tokens"]) if (s[k] !== undefined) req[k] = s[k];

  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  let finish = null;
  // Re-render the answer at most once a frame, however fast the tokens come.
  let painting = false;
  const paint = () => {
    painting = false;
    bodyEl.replaceChildren(renderMarkdown(answer.content));
    box.scrollTop = box.scrollHeight;
  };
  try {
    const resp = await apiFetch("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(req),
      signal: controller.signal,
    });
    if (!resp.ok) throw new Error(await errorText(resp));
    await readSse(resp.body, (data) => {
      if (data === "[DONE]") return false;
      const j = JSON.parse(data);
      if (j.error) throw new Error(j.error.message || "stream error");
      const ch = j.choices && j.choices[0];
      if (!ch) return true;
      if (ch.delta && ch.delta.content) {
        answer.content += ch.delta.content;
        if (!painting) { painting = true; requestAnimationFrame(paint); }
      }
      if (ch.finish_reason) finish = ch.finish_reason;
      return true;
    });
    if (finish === "length") answer.note = "(stopped at max_tokens)";
  } catch (e) {
    if (e.name === "AbortError") answer.note = "(stopped)";
    else { answer.note = "(error)"; showError(String(e.message || e)); }
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    c.updated = Date.now();
    save();
    renderMessages();
    const last = $("messages").lastElementChild;
    if (last) last.dataset.done = answer.note || "ok";
  }
}

async function showModel() {
  try {
    const r = await apiFetch("/v1/models");
    if (!r.ok) { $("model").textContent = await errorText(r); return; }
    const j = await r.json();
    $("model").textContent = "Model: " + (j.data?.[0]?.id ?? "?");
  } catch (e) { $("model").textContent = String(e); }
}

function init() {
  loadSettings();
  for (const id of ["temperature", "top_p", "max_tokens", "system"]) $(id).addEventListener("change", saveSettings);
  bindKeyInput($("api-key"), showModel);
  $("new-chat").addEventListener("click", () => { if (!controller) newConversation(); });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("composer").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const t = $("prompt").value;
    if (!t.trim() || controller) return;
    $("prompt").value = "";
    send(t);
  });
  $("prompt").addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      $("composer").requestSubmit();
    }
  });
  if (!conv()) { if (convs.length) current = convs[0].id; else newConversation(); }
  render();
  showModel();
}

init();
