// Minimal, safe markdown for model answers: fenced code blocks (with a copy button), inline
// code, **bold**, paragraphs and line breaks. It builds DOM nodes with textContent only, so
// model text can never become markup (no HTML is ever parsed from a string).

import { el, copyButton } from "./common.js";

// Split into text and fenced code parts; an unclosed fence (still streaming) runs to the end.
export function splitFences(text) {
  const parts = [];
  const lines = text.split("\n");
  let buf = [];
  let code = null; // {lang, lines}
  for (const line of lines) {
    const m = /^\s*```\s*([\w+.#-]*)\s*$/.exec(line);
    if (code === null && m) {
      if (buf.length) parts.push({ type: "text", text: buf.join("\n") });
      buf = [];
      code = { lang: m[1] || "", lines: [] };
    } else if (code !== null && /^\s*```\s*$/.test(line)) {
      parts.push({ type: "code", lang: code.lang, text: code.lines.join("\n"), closed: true });
      code = null;
    } else if (code !== null) {
      code.lines.push(line);
    } else {
      buf.push(line);
    }
  }
  if (code !== null) parts.push({ type: "code", lang: code.lang, text: code.lines.join("\n"), closed: false });
  else if (buf.length) parts.push({ type: "text", text: buf.join("\n") });
  return parts;
}

// `code` and **bold** inside one paragraph, appended to `parent`; newlines become <br>.
export function appendInline(parent, text) {
  const re = /(`[^`\n]+`)|(\*\*[^*\n][^\n]*?\*\*)/g;
  let last = 0;
  const plain = (s) => {
    s.split("\n").forEach((piece, i) => {
      if (i) parent.appendChild(document.createElement("br"));
      if (piece) parent.appendChild(document.createTextNode(piece));
    });
  };
  for (let m; (m = re.exec(text)) !== null;) {
    plain(text.slice(last, m.index));
    if (m[1]) parent.appendChild(el("code", null, m[1].slice(1, -1)));
    else parent.appendChild(el("strong", null, m[2].slice(2, -2)));
    last = m.index + m[0].length;
  }
  plain(text.slice(last));
}

// The rendered answer as a DocumentFragment.
export function renderMarkdown(text) {
  const frag = document.createDocumentFragment();
  for (const part of splitFences(text)) {
    if (part.type === "code") {
      const wrap = el("div", "codeblock");
      const bar = el("div", "codebar");
      bar.appendChild(el("span", "lang", part.lang || "code"));
      bar.appendChild(copyButton(() => part.text, "Copy code"));
      wrap.appendChild(bar);
      const pre = el("pre");
      pre.appendChild(el("code", part.lang ? "language-" + part.lang : null, part.text));
      wrap.appendChild(pre);
      frag.appendChild(wrap);
    } else {
      for (const para of part.text.split(/\n\s*\n/)) {
        if (!para.trim()) continue;
        const p = el("p");
        appendInline(p, para.replace(/^\n+|\n+$/g, ""));
        frag.appendChild(p);
      }
    }
  }
  return frag;
}
