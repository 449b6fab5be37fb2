// Shared by the chat page and the Monitor: the API key (kept in localStorage, sent as
// `Authorization: Bearer`), fetch with it, and small formatting helpers.

const KEY = "strata.apiKey";

export function apiKey() {
  return localStorage.getItem(KEY) || "";
}

export function setApiKey(k) {
  if (k) localStorage.setItem(KEY, k);
  else localStorage.removeItem(KEY);
}

// fetch() on this server (same origin) with the key, if one is set.
export function apiFetch(path, init = {}) {
  const headers = new Headers(init.headers || {});
  const k = apiKey();
  if (k) headers.set("Authorization", "Bearer " + k);
  return fetch(path, { ...init, headers });
}

// The error message of a failed response: OpenAI's or Anthropic's shape, else the status.
export async function errorText(resp) {
  let msg = "HTTP " + resp.status;
  try {
    const j = await resp.json();
    if (j && j.error && j.error.message) msg += ": " + j.error.message;
  } catch (_) { /* not JSON */ }
  if (resp.status === 401) msg += " (enter the server's API key)";
  return msg;
}

// Wire an <input> to the stored key; `onChange` runs after each change.
export function bindKeyInput(input, onChange) {
  input.value = apiKey();
  input.addEventListener("change", () => {
    setApiKey(input.value.trim());
    if (onChange) onChange();
  });
}

// document.createElement with a class and text (never markup).
export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch (_) {
    // Not a secure context, or no permission: the old way.
    const t = document.createElement("textarea");
    t.value = text;
    document.body.appendChild(t);
    t.select();
    let ok = false;
    try { ok = document.execCommand("copy"); } catch (_) { ok = false; }
    t.remove();
    return ok;
  }
}

// A button that copies what `get()` returns and says so for a moment.
export function copyButton(get, label = "Copy") {
  const b = el("button", "copy", label);
  b.type = "button";
  b.addEventListener("click", async () => {
    const ok = await copyText(get());
    b.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => { b.textContent = label; }, 1200);
  });
  return b;
}

export function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + u[i];
}

export function fmt(v, digits) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "number" && digits !== undefined) return v.toFixed(digits);
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}
