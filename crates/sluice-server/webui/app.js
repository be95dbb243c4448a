// sluice chat page: plain JavaScript, no dependencies, no build step. Served at / with a
// Content-Security-Policy that allows no inline script or style: everything here is wired with
// addEventListener, and styling goes through classes in style.css.
"use strict";

(() => {
  const $ = (sel, root = document) => root.querySelector(sel);
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text != null) e.textContent = text;
    return e;
  };
  const button = (text, cls, title) => {
    const b = el("button", cls, text);
    b.type = "button";
    if (title) b.title = title;
    return b;
  };

  // ---------------------------------------------------------------------------------------------
  // Markdown, rendered as DOM nodes.
  //
  // Model output is untrusted text. A markdown library turns it into an HTML string, and such a
  // string has to pass a sanitizer before it may go into innerHTML: one case the sanitizer misses
  // and the model's markup runs. Here the text is split into blocks and inline spans, and every
  // piece becomes a node made with createElement and filled with textContent. No string is ever
  // parsed as HTML, so nothing the model writes (a <script>, an onerror= attribute) can become an
  // element, let alone run. Links keep their target only when it is an http(s) URL.
  // It covers what chat answers use (headings, lists, quotes, fenced code, tables, emphasis,
  // inline code, links), not all of CommonMark.
  // ---------------------------------------------------------------------------------------------

  const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
  const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
  const HR = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
  const QUOTE = /^ {0,3}> ?/;
  const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])([ \t]+|$)(.*)$/;
  const TABLE_DELIM = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;

  const indentOf = (line) => line.length - line.trimStart().length;

  function startsTable(lines, i) {
    return (
      i + 1 < lines.length &&
      lines[i].includes("|") &&
      TABLE_DELIM.test(lines[i + 1]) &&
      (lines[i + 1].includes("|") || lines[i].trim().startsWith("|"))
    );
  }

  function startsBlock(lines, i) {
    const l = lines[i];
    return (
      FENCE.test(l) ||
      (HEADING.test(l) && /^ {0,3}#{1,6}([ \t]|$)/.test(l)) ||
      HR.test(l) ||
      QUOTE.test(l) ||
      ITEM.test(l) ||
      startsTable(lines, i)
    );
  }

  // Blocks of `text`, each {type, src, ...}. `src` is the block's own lines: a block renders
  // from its src alone, so a streamed answer re-renders only the blocks whose src changed.
  function parseBlocks(text) {
    const lines = text.replace(/\r\n?/g, "\n").replace(/\t/g, "    ").split("\n");
    const blocks = [];
    let i = 0;
    while (i < lines.length) {
      const line = lines[i];
      if (!line.trim()) {
        i++;
        continue;
      }
      const start = i;
      let m;
      if ((m = FENCE.exec(line))) {
        const fence = m[1];
        const close = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}[ \\t]*$`);
        const body = [];
        const pad = indentOf(line);
        i++;
        while (i < lines.length && !close.test(lines[i])) {
          body.push(lines[i].slice(Math.min(pad, indentOf(lines[i]))));
          i++;
        }
        if (i < lines.length) i++; // the closing fence
        blocks.push({ type: "code", lang: m[2] || "", text: body.join("\n"), src: lines.slice(start, i).join("\n") });
        continue;
      }
      if ((m = HEADING.exec(line)) && /^ {0,3}#{1,6}([ \t]|$)/.test(line)) {
        blocks.push({ type: "heading", level: m[1].length, text: m[2] || "", src: line });
        i++;
        continue;
      }
      if (HR.test(line)) {
        blocks.push({ type: "hr", src: line });
        i++;
        continue;
      }
      if (QUOTE.test(line)) {
        const inner = [];
        while (i < lines.length && lines[i].trim() && (QUOTE.test(lines[i]) || !startsBlock(lines, i))) {
          inner.push(lines[i].replace(QUOTE, ""));
          i++;
        }
        blocks.push({ type: "quote", children: parseBlocks(inner.join("\n")), src: lines.slice(start, i).join("\n") });
        continue;
      }
      if ((m = ITEM.exec(line))) {
        i = parseList(lines, i, m, blocks);
        continue;
      }
      if (startsTable(lines, i)) {
        const head = splitRow(lines[i]);
        const align = splitRow(lines[i + 1]).map((c) =>
          c.endsWith(":") ? (c.startsWith(":") ? "center" : "right") : c.startsWith(":") ? "left" : ""
        );
        const rows = [];
        i += 2;
        while (i < lines.length && lines[i].trim() && lines[i].includes("|")) {
          rows.push(splitRow(lines[i]));
          i++;
        }
        blocks.push({ type: "table", head, align, rows, src: lines.slice(start, i).join("\n") });
        continue;
      }
      const para = [line.trim()];
      i++;
      while (i < lines.length && lines[i].trim() && !startsBlock(lines, i)) {
        para.push(lines[i].trim());
        i++;
      }
      blocks.push({ type: "para", text: para.join("\n"), src: lines.slice(start, i).join("\n") });
    }
    return blocks;
  }

  function splitRow(line) {
    let s = line.trim();
    if (s.startsWith("|")) s = s.slice(1);
    if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
    return s.split(/(?<!\\)\|/).map((c) => c.trim().replace(/\\\|/g, "|"));
  }

  // One list starting at lines[i] (`first` is its ITEM match); pushes it, returns the next line.
  function parseList(lines, i, first, blocks) {
    const start = i;
    const base = first[1].length;
    const ordered = /\d/.test(first[2]);
    const kind = ordered ? first[2].slice(-1) : first[2];
    const items = [];
    let cur = null;
    while (i < lines.length) {
      const l = lines[i];
      const m = ITEM.exec(l);
      if (m && m[1].length <= base + 1) {
        const k = /\d/.test(m[2]) ? m[2].slice(-1) : m[2];
        if (k !== kind) break;
        const gap = m[3].length > 4 ? 1 : Math.max(m[3].length, 1);
        cur = { lines: [m[4]], indent: m[1].length + m[2].length + gap };
        items.push(cur);
        i++;
        continue;
      }
      if (!l.trim()) {
        let k = i + 1;
        while (k < lines.length && !lines[k].trim()) k++;
        if (k >= lines.length) break;
        const next = ITEM.exec(lines[k]);
        const sameLevel = next && next[1].length <= base + 1;
        if (indentOf(lines[k]) > base || sameLevel) {
          cur.lines.push("");
          i++;
          continue;
        }
        break;
      }
      if (indentOf(l) > base) {
        cur.lines.push(l.slice(Math.min(indentOf(l), cur.indent)));
        i++;
        continue;
      }
      if (cur.lines[cur.lines.length - 1].trim() && !startsBlock(lines, i)) {
        cur.lines.push(l.trim()); // a lazy continuation of the item's paragraph
        i++;
        continue;
      }
      break;
    }
    while (i > start + 1 && !lines[i - 1].trim()) i--;
    blocks.push({
      type: "list",
      ordered,
      start: ordered ? parseInt(first[2], 10) : 1,
      items: items.map((it) => it.lines.join("\n").replace(/\n+$/, "")),
      src: lines.slice(start, i).join("\n"),
    });
    return i;
  }

  function renderBlock(b) {
    switch (b.type) {
      case "code":
        return codeBlock(b.lang, b.text);
      case "heading": {
        const h = el(`h${b.level}`);
        inline(h, b.text);
        return h;
      }
      case "hr":
        return el("hr");
      case "quote": {
        const q = el("blockquote");
        for (const c of b.children) q.append(renderBlock(c));
        return q;
      }
      case "list": {
        const list = el(b.ordered ? "ol" : "ul");
        if (b.ordered && b.start !== 1) list.start = b.start;
        for (const item of b.items) {
          const li = el("li");
          // A tight item (no blank line in it) shows its text without paragraph spacing.
          const tight = !/\n[ ]*\n/.test(item);
          for (const c of parseBlocks(item)) {
            if (tight && c.type === "para") inline(li.appendChild(el("span", "li-text")), c.text);
            else li.append(renderBlock(c));
          }
          list.append(li);
        }
        return list;
      }
      case "table": {
        const wrap = el("table");
        const thead = el("thead");
        const hr = el("tr");
        b.head.forEach((c, k) => hr.append(cell("th", c, b.align[k])));
        thead.append(hr);
        const tbody = el("tbody");
        for (const row of b.rows) {
          const tr = el("tr");
          b.head.forEach((_, k) => tr.append(cell("td", row[k] || "", b.align[k])));
          tbody.append(tr);
        }
        wrap.append(thead, tbody);
        return wrap;
      }
      default: {
        const p = el("p");
        inline(p, b.text);
        return p;
      }
    }
  }

  function cell(tag, text, align) {
    const c = el(tag);
    if (align) c.align = align;
    inline(c, text);
    return c;
  }

  function codeBlock(lang, text) {
    const wrap = el("div", "code-block");
    const head = el("div", "code-head");
    head.append(el("span", "lang", lang || "text"), button("Copy", "copy", "Copy the code"));
    const pre = el("pre");
    const code = el("code", null, text);
    if (lang) code.dataset.lang = lang;
    pre.append(code);
    wrap.append(head, pre);
    return wrap;
  }

  // Inline spans, tried at each position where one can start; the first rule that matches wins.
  const INLINE_RULES = [
    ["esc", /\\([\\`*_{}[\]()#+\-.!~|<>])/y],
    ["code", /(`+)(?!`)([^`]|[^`][\s\S]*?[^`])\1(?!`)/y],
    ["link", /\[((?:[^[\]\n]|\[[^[\]\n]*\])+)\]\(\s*<?([^\s<>]*?)>?(?:\s+"[^"\n]*")?\s*\)/y],
    ["auto", /<?(https?:\/\/[^\s<>]*[^\s<>.,;:!?'")\]*_~])>?/y],
    ["strong", /\*\*(?=[^\s*])([\s\S]*?[^\s])\*\*/y],
    ["strong", /__(?=[^\s_])([\s\S]*?[^\s])__(?![A-Za-z0-9])/y],
    ["del", /~~(?=\S)([\s\S]*?\S)~~/y],
    ["em", /\*(?=[^\s*])([\s\S]*?[^\s*])\*(?!\*)/y],
    ["em", /_(?=[^\s_])([\s\S]*?[^\s_])_(?![A-Za-z0-9])/y],
  ];
  const INLINE_START = /[\\`[<h*_~]/;

  function safeHref(url) {
    if (!/^https?:\/\//i.test(url)) return null;
    try {
      const u = new URL(url);
      return u.protocol === "http:" || u.protocol === "https:" ? u.href : null;
    } catch {
      return null;
    }
  }

  function link(href, label) {
    const a = el("a");
    a.href = href;
    a.target = "_blank";
    a.rel = "noopener noreferrer";
    if (typeof label === "string") inline(a, label, true);
    else a.textContent = href;
    return a;
  }

  function inline(parent, text, inLink = false) {
    let plain = "";
    const flush = () => {
      if (!plain) return;
      const parts = plain.split("\n");
      parts.forEach((part, k) => {
        if (k) parent.append(el("br"));
        if (part) parent.append(document.createTextNode(part));
      });
      plain = "";
    };
    let p = 0;
    while (p < text.length) {
      const ch = text[p];
      let done = false;
      if (INLINE_START.test(ch)) {
        const prev = p ? text[p - 1] : " ";
        for (const [kind, re] of INLINE_RULES) {
          if (kind === "auto" && (inLink || /[A-Za-z0-9]/.test(prev))) continue;
          if (kind === "link" && inLink) continue;
          if (ch === "_" && /[A-Za-z0-9]/.test(prev)) continue;
          re.lastIndex = p;
          const m = re.exec(text);
          if (!m) continue;
          const end = re.lastIndex; // before any recursion below reuses `re`
          let node = null;
          if (kind === "esc") {
            plain += m[1];
          } else if (kind === "code") {
            let c = m[2].replace(/\n/g, " ");
            if (c.length > 2 && c.startsWith(" ") && c.endsWith(" ")) c = c.slice(1, -1);
            node = el("code", null, c);
          } else if (kind === "link") {
            const href = safeHref(m[2]);
            if (!href) continue; // shown as the literal text it is
            node = link(href, m[1]);
          } else if (kind === "auto") {
            const href = safeHref(m[1]);
            if (!href) continue;
            node = link(href, null);
          } else {
            node = el(kind === "strong" ? "strong" : kind === "em" ? "em" : "del");
            inline(node, m[1], inLink);
          }
          if (node) {
            flush();
            parent.append(node);
          }
          p = end;
          done = true;
          break;
        }
      }
      if (!done) {
        plain += ch;
        p++;
      }
    }
    flush();
  }

  // Renders `text` into `container`, keeping the nodes of the leading blocks that did not change.
  function renderMarkdown(container, text) {
    const blocks = parseBlocks(text);
    const old = container._blocks || [];
    let keep = 0;
    while (keep < blocks.length && keep < old.length && old[keep].src === blocks[keep].src && old[keep].type === blocks[keep].type) keep++;
    while (container.childNodes.length > keep) container.lastChild.remove();
    for (let k = keep; k < blocks.length; k++) container.append(renderBlock(blocks[k]));
    container._blocks = blocks;
  }

  // ---------------------------------------------------------------------------------------------
  // State, kept in localStorage.
  // ---------------------------------------------------------------------------------------------

  const KEYS = {
    convs: "sluice.conversations",
    current: "sluice.current",
    settings: "sluice.settings",
    apiKey: "sluice.apiKey",
  };

  function load(key, fallback) {
    try {
      const v = localStorage.getItem(key);
      return v == null ? fallback : JSON.parse(v);
    } catch {
      return fallback;
    }
  }

  function store(key, value) {
    try {
      localStorage.setItem(key, JSON.stringify(value));
    } catch (e) {
      notice(`Could not save in this browser's storage: ${e.message}`);
    }
  }

  const state = {
    convs: [],
    currentId: load(KEYS.current, null),
    settings: Object.assign({ model: "", system: "", temperature: "", maxTokens: "" }, load(KEYS.settings, {})),
    models: [],
    apiKey: localStorage.getItem(KEYS.apiKey) || "",
    run: null,
    images: [],
  };

  function loadConvs() {
    const convs = load(KEYS.convs, []);
    state.convs = Array.isArray(convs) ? convs.filter((c) => c && Array.isArray(c.messages)) : [];
    for (const c of state.convs) {
      for (const m of c.messages) if (m.state === "streaming") m.state = "stopped";
    }
  }

  const current = () => state.convs.find((c) => c.id === state.currentId) || null;

  function save() {
    store(KEYS.convs, state.convs);
    store(KEYS.current, state.currentId);
  }

  const uid = () => Date.now().toString(36) + Math.random().toString(36).slice(2, 8);

  // ---------------------------------------------------------------------------------------------
  // The API.
  // ---------------------------------------------------------------------------------------------

  // Relative URLs: the page also works behind a proxy that serves it under a path prefix.
  function api(path, opts = {}) {
    const headers = Object.assign({}, opts.headers);
    if (state.apiKey) headers.Authorization = `Bearer ${state.apiKey}`;
    return fetch(path, Object.assign({}, opts, { headers }));
  }

  async function errorText(res) {
    let text = "";
    try {
      text = await res.text();
    } catch {
      /* no body */
    }
    try {
      const j = JSON.parse(text);
      if (j && j.error) return typeof j.error === "string" ? j.error : j.error.message || JSON.stringify(j.error);
    } catch {
      /* not JSON */
    }
    return `${res.status} ${res.statusText}${text ? `: ${text.slice(0, 300)}` : ""}`;
  }

  async function loadModels() {
    let res;
    try {
      res = await api("v1/models");
    } catch (e) {
      notice(`Cannot reach the server: ${e.message}`);
      return;
    }
    if (res.status === 401) {
      askKey(await errorText(res));
      return;
    }
    if (!res.ok) {
      notice(`The model list failed: ${await errorText(res)}`);
      return;
    }
    hideKeyPrompt();
    let body;
    try {
      body = await res.json();
    } catch (e) {
      notice(`The model list is not JSON: ${e.message}`);
      return;
    }
    state.models = Array.isArray(body.data) ? body.data.filter((m) => m && typeof m.id === "string") : [];
    fillModels();
  }

  function fillModels() {
    const sel = $("#model");
    sel.replaceChildren();
    const ids = new Set(state.models.map((m) => m.id));
    const option = (m, label) => {
      const o = el("option", null, label);
      o.value = m.id;
      if (m.max_model_len) o.title = `context: ${m.max_model_len} tokens`;
      sel.append(o);
    };
    for (const m of state.models.filter((x) => !x.parent || !ids.has(x.parent))) {
      option(m, m.parent ? `${m.id} (adapter of ${m.parent})` : m.id);
      for (const a of state.models.filter((x) => x.parent === m.id)) option(a, `\u00a0\u00a0\u21b3 ${a.id} (adapter)`);
    }
    if (!state.models.length) {
      const o = el("option", null, "no model");
      o.value = "";
      sel.append(o);
    }
    if (ids.has(state.settings.model)) sel.value = state.settings.model;
    modelChanged();
  }

  function modelCard() {
    return state.models.find((m) => m.id === $("#model").value) || null;
  }

  function modelChanged() {
    const card = modelCard();
    const info = [];
    if (card && card.max_model_len) info.push(`context ${card.max_model_len} tokens`);
    if (card && card.parent) info.push(`LoRA adapter of ${card.parent}`);
    $("#model-info").textContent = info.join(" \u00b7 ");
    const images = !!(card && Array.isArray(card.input_modalities) && card.input_modalities.includes("image"));
    $("#attach").hidden = !images;
    if (!images && state.images.length) {
      state.images = [];
      renderAttachments();
    }
  }

  // The API-key prompt: shown when the API answers 401.
  function askKey(message) {
    const refused = !!state.apiKey;
    if (refused) {
      state.apiKey = "";
      localStorage.removeItem(KEYS.apiKey);
    }
    $("#api-key-dialog").hidden = false;
    const err = $("#api-key-error");
    err.textContent = refused ? `The server refused this key: ${message}` : "";
    err.hidden = !refused;
    $("#api-key").value = "";
    $("#api-key").focus();
    $("#forget-key").hidden = true;
  }

  function hideKeyPrompt() {
    $("#api-key-dialog").hidden = true;
    $("#forget-key").hidden = !state.apiKey;
  }

  // ---------------------------------------------------------------------------------------------
  // Rendering the conversation.
  // ---------------------------------------------------------------------------------------------

  const messagesEl = $("#messages");
  const emptyEl = $("#empty");

  function renderSidebar() {
    const ul = $("#conversations");
    ul.replaceChildren();
    const sorted = [...state.convs].sort((a, b) => (b.updated || 0) - (a.updated || 0));
    for (const c of sorted) {
      const li = el("li");
      li.dataset.id = c.id;
      if (c.id === state.currentId) li.className = "active";
      const open = button(c.title || "Untitled", "open", c.title || "");
      const del = button("\u00d7", "delete", "Delete this conversation");
      del.setAttribute("aria-label", "Delete conversation");
      li.append(open, del);
      ul.append(li);
    }
  }

  function renderConversation() {
    messagesEl.replaceChildren();
    const conv = current();
    if (!conv || !conv.messages.length) {
      messagesEl.append(emptyEl);
      return;
    }
    const lastIdx = conv.messages.length - 1;
    conv.messages.forEach((m, i) => messagesEl.append(renderMessage(m, i, i === lastIdx)));
    messagesEl.scrollTop = messagesEl.scrollHeight;
  }

  function renderMessage(msg, i, last) {
    const node = el("div", `message ${msg.role === "user" ? "user" : "assistant"}`);
    node.dataset.index = String(i);
    node.append(el("div", "role", msg.role === "user" ? "You" : "Assistant"));
    if (msg.role === "user") {
      if (Array.isArray(msg.images) && msg.images.length) {
        const imgs = el("div", "images");
        for (const src of msg.images) {
          if (typeof src !== "string" || !src.startsWith("data:image/")) continue;
          const img = el("img");
          img.alt = "attached image";
          img.src = src;
          imgs.append(img);
        }
        node.append(imgs);
      }
      node.append(el("div", "content", msg.content));
      const actions = el("div", "actions");
      actions.append(button("Edit", "edit", "Edit this message and send it again"));
      node.append(actions);
      return node;
    }
    const det = el("details", "reasoning");
    det.append(el("summary", null, "Reasoning"), el("div", "reasoning-text"));
    node.append(det, el("div", "tool-calls"), el("div", "content"), el("div", "error-text"), el("div", "stats"), el("div", "actions"));
    paintAssistant(node, msg, last);
    return node;
  }

  function paintAssistant(node, msg, last) {
    const streaming = msg.state === "streaming";
    node.classList.toggle("streaming", streaming);
    node.classList.toggle("error", msg.state === "error");
    node.dataset.state = msg.state || "done";

    const det = $(":scope > .reasoning", node);
    det.hidden = !msg.reasoning;
    if (msg.reasoning) {
      det.firstChild.textContent = streaming && !msg.content ? "Thinking\u2026" : "Reasoning";
      det.lastChild.textContent = msg.reasoning;
    }

    const toolsEl = $(":scope > .tool-calls", node);
    const tools = (msg.tools || []).filter(Boolean);
    toolsEl.hidden = !tools.length;
    toolsEl.replaceChildren(...tools.map((t) => toolNode(t, streaming)));

    renderMarkdown($(":scope > .content", node), msg.content || "");

    const errEl = $(":scope > .error-text", node);
    errEl.textContent = msg.error || "";
    errEl.hidden = !msg.error;

    const statsEl = $(":scope > .stats", node);
    statsEl.textContent = statsText(msg);
    statsEl.hidden = !statsEl.textContent;

    const actions = $(":scope > .actions", node);
    actions.replaceChildren();
    if (!streaming) {
      if (msg.content) actions.append(button("Copy", "copy-message", "Copy the answer's markdown"));
      if (last) actions.append(button("Regenerate", "regenerate", "Answer the last message again"));
    }

    const t = msg.timing || {};
    const set = (name, v) => {
      if (typeof v === "number") node.dataset[name] = v.toFixed(1);
    };
    set("tSend", t.tSend);
    set("tFirstChunk", t.tFirstChunk);
    set("tFirstRender", t.tFirstRender);
    set("tEnd", t.tEnd);
    if (typeof t.tFirstChunk === "number") set("ttftMs", t.tFirstChunk - t.tSend);
    if (msg.stats && typeof msg.stats.tokens === "number") node.dataset.tokens = String(msg.stats.tokens);
  }

  function toolNode(t, streaming) {
    const box = el("div", "tool-call");
    box.append(el("div", "tool-name", `Tool call: ${t.name || "\u2026"}`));
    let args = t.arguments || "";
    if (!streaming) {
      try {
        args = JSON.stringify(JSON.parse(args), null, 2);
      } catch {
        /* shown as it came */
      }
    }
    const pre = el("pre");
    pre.append(el("code", null, args));
    box.append(pre);
    return box;
  }

  function statsText(msg) {
    const s = msg.stats;
    const parts = [];
    if (s) {
      if (typeof s.tokens === "number") parts.push(`${s.tokens} token${s.tokens === 1 ? "" : "s"}`);
      if (typeof s.tps === "number") parts.push(`${s.tps.toFixed(1)} tok/s`);
      if (typeof s.ttftMs === "number") parts.push(`TTFT ${Math.round(s.ttftMs)} ms`);
    }
    if (msg.state === "stopped") parts.push("stopped");
    if (msg.finish === "length") parts.push("max tokens reached");
    if (parts.length && msg.model) parts.push(msg.model);
    return parts.join(" \u00b7 ");
  }

  // ---------------------------------------------------------------------------------------------
  // Sending and streaming.
  // ---------------------------------------------------------------------------------------------

  function requestMessages(conv) {
    const out = [];
    const system = state.settings.system.trim();
    if (system) out.push({ role: "system", content: system });
    for (const m of conv.messages) {
      if (m.role === "user") {
        if (Array.isArray(m.images) && m.images.length) {
          const parts = [{ type: "text", text: m.content }];
          for (const url of m.images) parts.push({ type: "image_url", image_url: { url } });
          out.push({ role: "user", content: parts });
        } else {
          out.push({ role: "user", content: m.content });
        }
      } else if (m.state !== "error") {
        out.push({ role: "assistant", content: m.content || "" });
      }
    }
    return out;
  }

  function setBusy(busy) {
    $("#send").hidden = busy;
    $("#stop").hidden = !busy;
  }

  function titleFrom(text) {
    const line = text.trim().split("\n")[0];
    return line.length > 48 ? `${line.slice(0, 47)}\u2026` : line || "Image";
  }

  function send() {
    const input = $("#prompt");
    const text = input.value;
    if (!text.trim() && !state.images.length) return;
    if (state.run) return;
    if (!$("#model").value) {
      notice("No model to send to: the server listed none yet.");
      loadModels();
      return;
    }
    notice("");
    let conv = current();
    if (!conv) {
      conv = { id: uid(), title: "", created: Date.now(), updated: Date.now(), messages: [] };
      state.convs.push(conv);
      state.currentId = conv.id;
    }
    const msg = { role: "user", content: text };
    if (state.images.length) msg.images = state.images.map((x) => x.url);
    conv.messages.push(msg);
    if (!conv.title) conv.title = titleFrom(text);
    input.value = "";
    autosize();
    state.images = [];
    renderAttachments();
    generate(conv);
  }

  async function generate(conv) {
    const model = $("#model").value;
    const history = requestMessages(conv);
    const msg = { role: "assistant", content: "", reasoning: "", tools: [], model, state: "streaming" };
    conv.messages.push(msg);
    conv.updated = Date.now();
    save();
    renderSidebar();
    renderConversation();
    const node = messagesEl.lastElementChild;
    const ctrl = new AbortController();
    const run = { ctrl, conv, msg, node, deltas: 0, usage: null, queued: false, savedAt: performance.now() };
    state.run = run;
    setBusy(true);

    const body = { model, messages: history, stream: true, stream_options: { include_usage: true } };
    const temperature = parseFloat(state.settings.temperature);
    if (Number.isFinite(temperature)) body.temperature = temperature;
    const maxTokens = parseInt(state.settings.maxTokens, 10);
    if (Number.isFinite(maxTokens) && maxTokens > 0) body.max_tokens = maxTokens;

    msg.timing = { tSend: performance.now() };
    node.dataset.tSend = msg.timing.tSend.toFixed(1);
    try {
      const res = await api("v1/chat/completions", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        signal: ctrl.signal,
      });
      if (!res.ok) {
        const text = await errorText(res);
        if (res.status === 401) askKey(text);
        throw new Error(text);
      }
      await readStream(res, run);
      msg.state = "done";
    } catch (e) {
      if (ctrl.signal.aborted) {
        msg.state = "stopped";
      } else {
        msg.state = "error";
        msg.error = e && e.message ? e.message : String(e);
      }
    }
    finish(run);
  }

  // Server-sent events over fetch: `data: {json}` lines, ending with `data: [DONE]`.
  async function readStream(res, run) {
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (!line.startsWith("data:")) continue; // blank separators, comments, event: lines
        const data = line.slice(5).trim();
        if (data === "[DONE]") {
          // The answer is complete; read what may follow to its end without waiting for it
          // (cancelling the body instead would show as a failed request).
          drain(reader);
          return;
        }
        let chunk;
        try {
          chunk = JSON.parse(data);
        } catch {
          continue;
        }
        onChunk(run, chunk);
      }
    }
  }

  async function drain(reader) {
    try {
      while (!(await reader.read()).done);
    } catch {
      /* the connection closed: nothing left to read */
    }
  }

  function onChunk(run, chunk) {
    if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
    if (chunk.usage) run.usage = chunk.usage;
    const choice = Array.isArray(chunk.choices) ? chunk.choices[0] : null;
    if (!choice) return;
    const msg = run.msg;
    const d = choice.delta || {};
    let got = false;
    if (typeof d.content === "string" && d.content) {
      msg.content += d.content;
      got = true;
    }
    const reasoning = d.reasoning_content != null ? d.reasoning_content : d.reasoning;
    if (typeof reasoning === "string" && reasoning) {
      msg.reasoning += reasoning;
      got = true;
    }
    if (Array.isArray(d.tool_calls)) {
      for (const tc of d.tool_calls) {
        const k = Number.isInteger(tc.index) ? tc.index : 0;
        const slot = msg.tools[k] || (msg.tools[k] = { id: "", name: "", arguments: "" });
        if (tc.id) slot.id = tc.id;
        if (tc.function) {
          if (typeof tc.function.name === "string") slot.name += tc.function.name;
          if (typeof tc.function.arguments === "string") slot.arguments += tc.function.arguments;
        }
      }
      got = true;
    }
    if (choice.finish_reason) msg.finish = choice.finish_reason;
    if (!got) return;
    run.deltas++;
    if (msg.timing.tFirstChunk == null) {
      msg.timing.tFirstChunk = performance.now();
      run.node.dataset.tFirstChunk = msg.timing.tFirstChunk.toFixed(1);
      run.node.dataset.ttftMs = (msg.timing.tFirstChunk - msg.timing.tSend).toFixed(1);
    }
    schedulePaint(run);
  }

  // The streamed answer is re-rendered at most once per animation frame (every quarter second
  // while the tab is hidden, where frames do not run).
  function schedulePaint(run) {
    if (run.queued) return;
    run.queued = true;
    const go = () => {
      run.queued = false;
      if (state.run === run) paintRun(run);
    };
    if (document.hidden) setTimeout(go, 250);
    else requestAnimationFrame(go);
  }

  function paintRun(run) {
    const { msg, node } = run;
    if (!node.isConnected) return;
    const stick = messagesEl.scrollHeight - messagesEl.scrollTop - messagesEl.clientHeight < 80;
    msg.stats = liveStats(run);
    paintAssistant(node, msg, true);
    if (msg.timing.tFirstRender == null && (msg.content || msg.reasoning || msg.tools.length)) {
      // The first token is in the DOM now; the browser paints it at the end of this frame.
      msg.timing.tFirstRender = performance.now();
      node.dataset.tFirstRender = msg.timing.tFirstRender.toFixed(1);
    }
    if (stick) messagesEl.scrollTop = messagesEl.scrollHeight;
    if (performance.now() - run.savedAt > 2000) {
      run.savedAt = performance.now();
      save();
    }
  }

  // Tokens from the usage chunk when the server sent one, else the number of deltas; tokens per
  // second over the decode (first token to last), TTFT from send to the first delta.
  function liveStats(run) {
    const t = run.msg.timing;
    const end = t.tEnd != null ? t.tEnd : performance.now();
    const fromUsage = run.usage && Number.isFinite(run.usage.completion_tokens);
    const tokens = fromUsage ? run.usage.completion_tokens : run.deltas;
    const stats = { tokens, tokensFrom: fromUsage ? "usage" : "deltas" };
    if (t.tFirstChunk != null) {
      stats.ttftMs = t.tFirstChunk - t.tSend;
      const secs = (end - t.tFirstChunk) / 1000;
      if (tokens > 1 && secs > 0) stats.tps = (tokens - 1) / secs;
    }
    if (run.usage && Number.isFinite(run.usage.prompt_tokens)) stats.promptTokens = run.usage.prompt_tokens;
    return stats;
  }

  function finish(run) {
    const { msg, node, conv } = run;
    msg.timing.tEnd = performance.now();
    msg.tools = msg.tools.filter(Boolean);
    msg.stats = liveStats(run);
    if (state.run === run) {
      state.run = null;
      setBusy(false);
    }
    conv.updated = Date.now();
    save();
    renderSidebar();
    if (node.isConnected) {
      const stick = messagesEl.scrollHeight - messagesEl.scrollTop - messagesEl.clientHeight < 80;
      paintAssistant(node, msg, conv.messages[conv.messages.length - 1] === msg);
      if (stick) messagesEl.scrollTop = messagesEl.scrollHeight;
      if (msg.timing.tFirstRender == null && (msg.content || msg.reasoning || msg.tools.length)) {
        msg.timing.tFirstRender = performance.now();
        node.dataset.tFirstRender = msg.timing.tFirstRender.toFixed(1);
      }
    }
  }

  function stop() {
    if (state.run) state.run.ctrl.abort();
  }

  function regenerate() {
    const conv = current();
    if (!conv) return;
    stop();
    while (conv.messages.length && conv.messages[conv.messages.length - 1].role !== "user") conv.messages.pop();
    if (!conv.messages.length) return;
    generate(conv);
  }

  function startEdit(node, i) {
    const conv = current();
    const msg = conv && conv.messages[i];
    if (!msg || msg.role !== "user") return;
    const content = $(":scope > .content", node);
    const box = el("div", "edit-box");
    const ta = el("textarea", "edit-input");
    ta.value = msg.content;
    const row = el("div", "row");
    const cancel = button("Cancel", "cancel-edit");
    const ok = button("Send", "save-edit primary");
    row.append(cancel, ok);
    box.append(ta, row);
    content.replaceWith(box);
    $(":scope > .actions", node).hidden = true;
    ta.focus();
    const submit = () => {
      const text = ta.value;
      if (!text.trim()) return;
      stop();
      conv.messages.splice(i);
      const edited = { role: "user", content: text };
      if (msg.images) edited.images = msg.images;
      conv.messages.push(edited);
      if (i === 0) conv.title = titleFrom(text);
      generate(conv);
    };
    ok.addEventListener("click", submit);
    cancel.addEventListener("click", () => renderConversation());
    ta.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        submit();
      } else if (e.key === "Escape") {
        renderConversation();
      }
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Conversations, export, attachments, notices.
  // ---------------------------------------------------------------------------------------------

  function switchTo(id) {
    if (id === state.currentId) return;
    stop();
    state.currentId = id;
    store(KEYS.current, id);
    renderSidebar();
    renderConversation();
    $("#app").classList.remove("sidebar-open");
  }

  function newChat() {
    stop();
    state.currentId = null;
    store(KEYS.current, null);
    renderSidebar();
    renderConversation();
    $("#app").classList.remove("sidebar-open");
    $("#prompt").focus();
  }

  function deleteConv(id) {
    if (state.run && state.run.conv.id === id) stop();
    state.convs = state.convs.filter((c) => c.id !== id);
    if (state.currentId === id) state.currentId = null;
    save();
    renderSidebar();
    renderConversation();
  }

  function exportConv() {
    const conv = current();
    if (!conv) {
      notice("Nothing to export yet: this conversation is empty.");
      return;
    }
    const data = {
      format: "sluice-chat",
      version: 1,
      exported: new Date().toISOString(),
      system: state.settings.system,
      ...conv,
    };
    const blob = new Blob([JSON.stringify(data, null, 2)], { type: "application/json" });
    const url = URL.createObjectURL(blob);
    const a = el("a");
    a.href = url;
    const slug = (conv.title || "chat").toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "").slice(0, 40);
    a.download = `sluice-${slug || "chat"}.json`;
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  function renderAttachments() {
    const box = $("#attachments");
    box.replaceChildren();
    state.images.forEach((img, k) => {
      const t = el("div", "thumb");
      const i = el("img");
      i.src = img.url;
      i.alt = img.name;
      const rm = button("\u00d7", "remove", "Remove");
      rm.addEventListener("click", () => {
        state.images.splice(k, 1);
        renderAttachments();
      });
      t.append(i, rm);
      box.append(t);
    });
    box.hidden = !state.images.length;
  }

  function addFiles(files) {
    for (const f of files) {
      if (!f.type.startsWith("image/")) continue;
      const r = new FileReader();
      r.addEventListener("load", () => {
        if (typeof r.result === "string" && r.result.startsWith("data:image/")) {
          state.images.push({ url: r.result, name: f.name });
          renderAttachments();
        }
      });
      r.readAsDataURL(f);
    }
  }

  function notice(text) {
    const n = $("#notice");
    n.textContent = text;
    n.hidden = !text;
  }

  async function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      try {
        await navigator.clipboard.writeText(text);
        return true;
      } catch {
        /* fall back below */
      }
    }
    const ta = el("textarea", "sr-only");
    ta.value = text;
    ta.setAttribute("readonly", "");
    document.body.append(ta);
    ta.select();
    let ok = false;
    try {
      ok = document.execCommand("copy");
    } catch {
      ok = false;
    }
    ta.remove();
    return ok;
  }

  function flash(btn, text) {
    const was = btn.textContent;
    btn.textContent = text;
    setTimeout(() => {
      btn.textContent = was;
    }, 1500);
  }

  function autosize() {
    const p = $("#prompt");
    p.style.height = "auto";
    p.style.height = `${Math.min(p.scrollHeight + 2, window.innerHeight * 0.4)}px`;
  }

  // ---------------------------------------------------------------------------------------------
  // Wiring.
  // ---------------------------------------------------------------------------------------------

  function wire() {
    $("#composer").addEventListener("submit", (e) => {
      e.preventDefault();
      send();
    });
    const prompt = $("#prompt");
    prompt.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
        e.preventDefault();
        send();
      } else if (e.key === "Escape" && state.run) {
        stop();
      }
    });
    prompt.addEventListener("input", autosize);
    $("#stop").addEventListener("click", stop);

    messagesEl.addEventListener("click", (e) => {
      const b = e.target.closest("button");
      if (!b) return;
      const node = b.closest(".message");
      if (b.classList.contains("copy") && b.closest(".code-block")) {
        copyText($("code", b.closest(".code-block")).textContent).then((ok) => flash(b, ok ? "Copied" : "Copy failed"));
      } else if (b.classList.contains("copy-message") && node) {
        const conv = current();
        const msg = conv && conv.messages[Number(node.dataset.index)];
        if (msg) copyText(msg.content).then((ok) => flash(b, ok ? "Copied" : "Copy failed"));
      } else if (b.classList.contains("regenerate")) {
        regenerate();
      } else if (b.classList.contains("edit") && node) {
        startEdit(node, Number(node.dataset.index));
      }
    });

    $("#conversations").addEventListener("click", (e) => {
      const b = e.target.closest("button");
      const li = b && b.closest("li");
      if (!li) return;
      if (b.classList.contains("open")) {
        switchTo(li.dataset.id);
      } else if (b.classList.contains("delete")) {
        // Two clicks delete (no confirm() dialog): the first arms the button for three seconds.
        if (b.classList.contains("confirm")) {
          deleteConv(li.dataset.id);
        } else {
          b.classList.add("confirm");
          b.textContent = "Delete?";
          setTimeout(() => {
            if (b.isConnected) {
              b.classList.remove("confirm");
              b.textContent = "\u00d7";
            }
          }, 3000);
        }
      }
    });
    $("#new-chat").addEventListener("click", newChat);
    $("#export").addEventListener("click", exportConv);
    $("#toggle-sidebar").addEventListener("click", () => $("#app").classList.toggle("sidebar-open"));
    $("#scrim").addEventListener("click", () => $("#app").classList.remove("sidebar-open"));

    $("#toggle-settings").addEventListener("click", () => {
      const s = $("#settings");
      s.hidden = !s.hidden;
      $("#toggle-settings").setAttribute("aria-expanded", String(!s.hidden));
    });
    const bind = (sel, key) => {
      const input = $(sel);
      input.value = state.settings[key] || "";
      input.addEventListener("input", () => {
        state.settings[key] = input.value;
        store(KEYS.settings, state.settings);
      });
    };
    bind("#system", "system");
    bind("#temperature", "temperature");
    bind("#max-tokens", "maxTokens");
    $("#model").addEventListener("change", () => {
      state.settings.model = $("#model").value;
      store(KEYS.settings, state.settings);
      modelChanged();
    });

    $("#api-key-form").addEventListener("submit", (e) => {
      e.preventDefault();
      const key = $("#api-key").value.trim();
      if (!key) return;
      state.apiKey = key;
      localStorage.setItem(KEYS.apiKey, key);
      $("#api-key-error").hidden = true;
      loadModels();
    });
    $("#forget-key").addEventListener("click", () => {
      state.apiKey = "";
      localStorage.removeItem(KEYS.apiKey);
      $("#forget-key").hidden = true;
      loadModels();
    });

    $("#attach").addEventListener("click", () => $("#attach-file").click());
    $("#attach-file").addEventListener("change", (e) => {
      addFiles(e.target.files);
      e.target.value = "";
    });

    document.addEventListener("visibilitychange", () => {
      if (!document.hidden && state.run) schedulePaint(state.run);
    });
    // Another tab changed the conversations: show its version unless this tab is streaming.
    window.addEventListener("storage", (e) => {
      if (e.key === KEYS.convs && !state.run) {
        loadConvs();
        if (!current()) state.currentId = null;
        renderSidebar();
        renderConversation();
      }
    });
  }

  loadConvs();
  if (!current()) state.currentId = null;
  wire();
  renderSidebar();
  renderConversation();
  hideKeyPrompt();
  loadModels();
  $("#prompt").focus();
})();
