// The chat page of `mica serve`: a model picker, streamed answers with a stop button, a
// system prompt and sampling settings per request, regenerate / edit, Markdown answers,
// conversations in localStorage (list, new, delete, export / import as JSON), numbers per
// answer, and the API key prompt when the server asks for a key.

import { ApiError, listModels, streamChat, type ChatMessage, type Usage } from "./api";
import { highlightCode, renderMarkdown } from "./markdown";
import * as store from "./store";
import type { Conversation, Message, Stats } from "./store";

function $<T extends HTMLElement>(id: string): T {
  const el = document.getElementById(id);
  if (!el) throw new Error(`#${id} is missing from the page`);
  return el as T;
}

const ui = {
  sidebar: $<HTMLElement>("sidebar"),
  toggleSidebar: $<HTMLButtonElement>("toggle-sidebar"),
  newChat: $<HTMLButtonElement>("new-chat"),
  list: $<HTMLUListElement>("conversations"),
  exportBtn: $<HTMLButtonElement>("export"),
  importBtn: $<HTMLButtonElement>("import"),
  importFile: $<HTMLInputElement>("import-file"),
  model: $<HTMLSelectElement>("model"),
  settingsToggle: $<HTMLButtonElement>("settings-toggle"),
  settings: $<HTMLElement>("settings"),
  system: $<HTMLTextAreaElement>("system"),
  temperature: $<HTMLInputElement>("temperature"),
  topP: $<HTMLInputElement>("top-p"),
  maxTokens: $<HTMLInputElement>("max-tokens"),
  seed: $<HTMLInputElement>("seed"),
  changeKey: $<HTMLButtonElement>("change-key"),
  messages: $<HTMLElement>("messages"),
  status: $<HTMLElement>("status"),
  composer: $<HTMLFormElement>("composer"),
  input: $<HTMLTextAreaElement>("input"),
  send: $<HTMLButtonElement>("send"),
  stop: $<HTMLButtonElement>("stop"),
  keyDialog: $<HTMLDialogElement>("key-dialog"),
  keyForm: $<HTMLFormElement>("key-form"),
  keyInput: $<HTMLInputElement>("key-input"),
  keyMessage: $<HTMLElement>("key-message"),
};

let conversations: Conversation[] = store.loadConversations();
let settings = store.loadSettings();
let apiKey = store.loadKey();
let currentId: string | null = conversations.length ? newest().id : null;
let running: { controller: AbortController; conv: Conversation } | null = null;

function newest(): Conversation {
  return conversations.reduce((a, b) => (b.updated > a.updated ? b : a));
}

function current(): Conversation | null {
  return conversations.find((c) => c.id === currentId) ?? null;
}

function save(): void {
  try {
    store.saveConversations(conversations);
  } catch (e) {
    setStatus(`Could not save the conversations in this browser: ${(e as Error).message}`, true);
  }
}

function setStatus(text: string, error = false): void {
  ui.status.textContent = text;
  ui.status.classList.toggle("error", error);
  ui.status.setAttribute("role", error ? "alert" : "status");
}

// --- Models and the API key -------------------------------------------------------------

async function loadModels(): Promise<void> {
  try {
    const ids = await listModels(apiKey);
    ui.model.replaceChildren(
      ...ids.map((id) => {
        const o = document.createElement("option");
        o.value = o.textContent = id;
        return o;
      }),
    );
    const want = current()?.model || settings.model;
    if (ids.includes(want)) ui.model.value = want;
    settings.model = ui.model.value;
    store.saveSettings(settings);
    if (!ids.length) setStatus("The server has no models.", true);
    else if (ui.status.classList.contains("error")) setStatus("");
  } catch (e) {
    handleError(e, "Listing the models failed");
  }
}

function askKey(message: string): void {
  ui.keyMessage.textContent = message;
  ui.keyInput.value = apiKey ?? "";
  if (!ui.keyDialog.open) ui.keyDialog.showModal();
  ui.keyInput.focus();
}

ui.keyForm.addEventListener("submit", (ev) => {
  ev.preventDefault();
  const key = ui.keyInput.value.trim();
  apiKey = key || null;
  store.saveKey(apiKey);
  ui.keyDialog.close();
  ui.input.focus();
  void loadModels();
});

ui.changeKey.addEventListener("click", () => askKey("The API key this page sends (kept in this browser's local storage). Leave empty to send none."));

function handleError(e: unknown, what: string): void {
  if (e instanceof ApiError && e.status === 401) {
    askKey(apiKey ? "The server refused this API key: enter another." : "This server needs an API key.");
    setStatus(`${what}: the server needs an API key.`, true);
  } else if (e instanceof ApiError && e.code === "origin_not_allowed") {
    setStatus(`${what}: ${e.message}. Start mica serve with --allowed-origins ${location.origin}.`, true);
  } else {
    setStatus(`${what}: ${(e as Error).message}`, true);
  }
}

// --- Conversations ----------------------------------------------------------------------

function newConversation(): Conversation {
  const now = Date.now();
  const c: Conversation = {
    id: store.newId(),
    title: "New chat",
    model: ui.model.value || settings.model,
    system: current()?.system ?? "",
    created: now,
    updated: now,
    messages: [],
  };
  conversations.push(c);
  currentId = c.id;
  return c;
}

function renderList(): void {
  const sorted = [...conversations].sort((a, b) => b.updated - a.updated);
  ui.list.replaceChildren(
    ...sorted.map((c) => {
      const li = document.createElement("li");
      li.className = c.id === currentId ? "current" : "";
      const open = document.createElement("button");
      open.className = "open";
      open.textContent = c.title;
      open.title = c.title;
      if (c.id === currentId) open.setAttribute("aria-current", "true");
      open.addEventListener("click", () => {
        currentId = c.id;
        document.body.classList.remove("sidebar-open");
        renderAll();
        ui.input.focus();
      });
      const del = document.createElement("button");
      del.className = "delete";
      del.textContent = "×";
      del.setAttribute("aria-label", `Delete conversation “${c.title}”`);
      del.addEventListener("click", () => deleteConversation(c));
      li.append(open, del);
      return li;
    }),
  );
}

function deleteConversation(c: Conversation): void {
  if (running?.conv === c) running.controller.abort();
  conversations = conversations.filter((x) => x !== c);
  if (currentId === c.id) currentId = conversations.length ? newest().id : null;
  save();
  renderAll();
  setStatus(`Deleted “${c.title}”.`);
}

ui.newChat.addEventListener("click", () => {
  newConversation();
  save();
  renderAll();
  document.body.classList.remove("sidebar-open");
  ui.input.focus();
});

ui.exportBtn.addEventListener("click", () => {
  const blob = new Blob([JSON.stringify(store.exportFile(conversations), null, 2)], { type: "application/json" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(blob);
  a.download = `mica-chats-${new Date().toISOString().slice(0, 10)}.json`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 10_000);
  setStatus(`Exported ${conversations.length} conversation(s).`);
});

ui.importBtn.addEventListener("click", () => ui.importFile.click());
ui.importFile.addEventListener("change", async () => {
  const file = ui.importFile.files?.[0];
  ui.importFile.value = "";
  if (!file) return;
  try {
    const imported = store.parseImport(await file.text());
    for (const c of imported) {
      if (conversations.some((x) => x.id === c.id)) c.id = store.newId();
      conversations.push(c);
    }
    if (imported.length) currentId = imported[imported.length - 1].id;
    save();
    renderAll();
    setStatus(`Imported ${imported.length} conversation(s).`);
  } catch (e) {
    setStatus(`Import failed: ${(e as Error).message}`, true);
  }
});

// --- Messages ---------------------------------------------------------------------------

function formatStats(s: Stats): string {
  const parts = [`${s.exact ? "" : "≈"}${s.tokens} tokens`];
  if (s.tokensPerSecond !== null) parts.push(`${s.tokensPerSecond.toFixed(1)} tok/s`);
  if (s.ttftMs !== null) parts.push(`first token ${Math.round(s.ttftMs)} ms`);
  if (s.promptTokens !== null) parts.push(`prompt ${s.promptTokens} tokens`);
  if (s.finish !== "stop") parts.push(s.finish === "abort" ? "stopped" : s.finish);
  return parts.join(" · ");
}

function messageBody(m: Message, body: HTMLElement): void {
  if (m.role === "assistant") {
    body.innerHTML = renderMarkdown(m.content);
    highlightCode(body);
  } else {
    body.textContent = m.content;
  }
}

function renderMessage(conv: Conversation, i: number): HTMLElement {
  const m = conv.messages[i];
  const el = document.createElement("article");
  el.className = `msg ${m.role}`;
  el.dataset.index = String(i);
  const role = document.createElement("div");
  role.className = "role";
  role.textContent = m.role === "user" ? "You" : "Assistant";
  const body = document.createElement("div");
  body.className = "body";
  messageBody(m, body);
  el.append(role, body);
  if (m.stats) {
    const stats = document.createElement("div");
    stats.className = "stats";
    stats.textContent = formatStats(m.stats);
    el.append(stats);
  }
  const busy = running !== null;
  const actions = document.createElement("div");
  actions.className = "actions";
  if (m.role === "user" && !busy) {
    const edit = document.createElement("button");
    edit.textContent = "Edit";
    edit.className = "edit";
    edit.addEventListener("click", () => startEdit(conv, i, el));
    actions.append(edit);
  }
  if (m.role === "assistant" && i === conv.messages.length - 1 && !busy) {
    const regen = document.createElement("button");
    regen.textContent = "Regenerate";
    regen.className = "regenerate";
    regen.addEventListener("click", () => {
      conv.messages.pop();
      void run(conv);
    });
    actions.append(regen);
  }
  if (actions.childElementCount) el.append(actions);
  return el;
}

function renderMessages(): void {
  const conv = current();
  if (!conv || !conv.messages.length) {
    const empty = document.createElement("p");
    empty.className = "empty";
    empty.textContent = "Ask something. Enter sends, Shift+Enter starts a new line, Escape stops an answer.";
    ui.messages.replaceChildren(empty);
    return;
  }
  ui.messages.replaceChildren(...conv.messages.map((_, i) => renderMessage(conv, i)));
}

function startEdit(conv: Conversation, i: number, el: HTMLElement): void {
  const body = el.querySelector(".body") as HTMLElement;
  const area = document.createElement("textarea");
  area.className = "edit-area";
  area.value = conv.messages[i].content;
  area.setAttribute("aria-label", "Edit the message");
  const saveBtn = document.createElement("button");
  saveBtn.textContent = "Save and send";
  const cancel = document.createElement("button");
  cancel.textContent = "Cancel";
  const bar = document.createElement("div");
  bar.className = "actions";
  bar.append(saveBtn, cancel);
  el.querySelector(":scope > .actions")?.remove();
  body.replaceChildren(area, bar);
  const commit = () => {
    const text = area.value.trim();
    if (!text) return;
    conv.messages.splice(i);
    conv.messages.push({ role: "user", content: text });
    if (i === 0) conv.title = titleOf(text);
    void run(conv);
  };
  saveBtn.addEventListener("click", commit);
  cancel.addEventListener("click", () => renderMessages());
  area.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
      ev.preventDefault();
      commit();
    } else if (ev.key === "Escape") {
      ev.preventDefault();
      ev.stopPropagation();
      renderMessages();
      ui.input.focus();
    }
  });
  area.focus();
}

function titleOf(text: string): string {
  const line = text.split("\n")[0].trim();
  return line.length > 48 ? `${line.slice(0, 47)}…` : line || "New chat";
}

function nearBottom(): boolean {
  const m = ui.messages;
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

// --- Generation -------------------------------------------------------------------------

function setRunning(on: boolean): void {
  ui.send.hidden = on;
  ui.stop.hidden = !on;
  document.body.classList.toggle("running", on);
}

async function run(conv: Conversation): Promise<void> {
  if (running) return;
  const model = ui.model.value;
  if (!model) {
    setStatus("No model to answer: the model list is empty or did not load.", true);
    return;
  }
  conv.model = model;
  const request: ChatMessage[] = [];
  if (conv.system.trim()) request.push({ role: "system", content: conv.system });
  for (const m of conv.messages) request.push({ role: m.role, content: m.content });
  const answer: Message = { role: "assistant", content: "" };
  conv.messages.push(answer);
  conv.updated = Date.now();
  const controller = new AbortController();
  running = { controller, conv };
  setRunning(true);
  setStatus("Generating…");
  renderAll();
  const el = ui.messages.lastElementChild as HTMLElement;
  el.classList.add("streaming");
  // Screen readers wait for the answer instead of reading every repaint.
  el.setAttribute("aria-busy", "true");
  const body = el.querySelector(".body") as HTMLElement;

  const t0 = performance.now();
  let tFirst: number | null = null;
  let pieces = 0;
  let usage: Usage | null = null;
  let finish = "stop";
  let timer: number | null = null;
  const paint = () => {
    timer = null;
    const stick = nearBottom();
    messageBody(answer, body);
    if (stick) ui.messages.scrollTop = ui.messages.scrollHeight;
  };
  let failed: unknown = null;
  try {
    await streamChat(apiKey, model, request, settings, controller.signal, {
      onText(text) {
        if (tFirst === null) tFirst = performance.now();
        pieces += 1;
        answer.content += text;
        if (timer === null) timer = window.setTimeout(paint, 30);
      },
      onUsage(u) {
        usage = u;
      },
      onFinish(reason) {
        finish = reason;
      },
    });
  } catch (e) {
    if ((e as Error).name === "AbortError") finish = "abort";
    else failed = e;
  }
  if (timer !== null) window.clearTimeout(timer);
  const tEnd = performance.now();
  const u = usage as Usage | null;
  const tokens = u ? u.completion_tokens : pieces;
  answer.stats = {
    tokens,
    exact: u !== null,
    promptTokens: u ? u.prompt_tokens : null,
    ttftMs: tFirst === null ? null : tFirst - t0,
    totalMs: tEnd - t0,
    tokensPerSecond: tFirst !== null && tokens > 1 && tEnd > tFirst ? ((tokens - 1) * 1000) / (tEnd - tFirst) : null,
    finish,
  };
  // An answer that failed or was stopped before its first token leaves nothing behind.
  if (!answer.content && (failed !== null || finish === "abort")) conv.messages.pop();
  running = null;
  setRunning(false);
  conv.updated = Date.now();
  save();
  if (currentId === conv.id) renderAll();
  else renderList();
  if (failed !== null) handleError(failed, "The answer failed");
  else setStatus(finish === "abort" ? "Stopped." : "");
  if (!ui.keyDialog.open) ui.input.focus();
}

function stop(): void {
  running?.controller.abort();
}

function send(): void {
  const text = ui.input.value.trim();
  if (!text) return;
  if (running) {
    setStatus("An answer is still being written: stop it (Escape) or wait.", true);
    return;
  }
  const conv = current() ?? newConversation();
  if (!conv.messages.length) conv.title = titleOf(text);
  conv.messages.push({ role: "user", content: text });
  ui.input.value = "";
  void run(conv);
}

ui.composer.addEventListener("submit", (ev) => {
  ev.preventDefault();
  send();
});
ui.input.addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) {
    ev.preventDefault();
    send();
  }
});
ui.stop.addEventListener("click", stop);
document.addEventListener("keydown", (ev) => {
  if (ev.key === "Escape" && running && !ui.keyDialog.open) {
    ev.preventDefault();
    stop();
  }
});

// --- Settings ---------------------------------------------------------------------------

function numberOr(input: HTMLInputElement, min: number, max: number, fallback: number | null): number | null {
  if (input.value.trim() === "") return fallback;
  const v = Number(input.value);
  return Number.isFinite(v) && v >= min && v <= max ? v : NaN;
}

function readSettings(): void {
  const t = numberOr(ui.temperature, 0, 2, 0.7);
  const p = numberOr(ui.topP, 0, 1, 1);
  const mt = numberOr(ui.maxTokens, 1, 1 << 20, null);
  const seed = numberOr(ui.seed, 0, Number.MAX_SAFE_INTEGER, null);
  const bad = [
    [t, ui.temperature],
    [p, ui.topP],
    [mt, ui.maxTokens],
    [seed, ui.seed],
  ].filter(([v]) => Number.isNaN(v)) as [number, HTMLInputElement][];
  for (const input of [ui.temperature, ui.topP, ui.maxTokens, ui.seed]) {
    input.setAttribute("aria-invalid", String(bad.some(([, i]) => i === input)));
  }
  if (bad.length) {
    setStatus(`Out of range: ${bad.map(([, i]) => i.labels?.[0]?.textContent ?? i.id).join(", ")}.`, true);
    return;
  }
  settings = {
    ...settings,
    temperature: t as number,
    top_p: p as number,
    max_tokens: mt === null ? null : Math.round(mt),
    seed: seed === null ? null : Math.round(seed),
  };
  store.saveSettings(settings);
  if (ui.status.classList.contains("error")) setStatus("");
}

function showSettings(): void {
  ui.temperature.value = String(settings.temperature);
  ui.topP.value = String(settings.top_p);
  ui.maxTokens.value = settings.max_tokens === null ? "" : String(settings.max_tokens);
  ui.seed.value = settings.seed === null ? "" : String(settings.seed);
  ui.system.value = current()?.system ?? "";
}

for (const input of [ui.temperature, ui.topP, ui.maxTokens, ui.seed]) input.addEventListener("change", readSettings);
ui.system.addEventListener("input", () => {
  const conv = current() ?? newConversation();
  conv.system = ui.system.value;
  save();
  renderList();
});
ui.model.addEventListener("change", () => {
  settings.model = ui.model.value;
  store.saveSettings(settings);
});
ui.settingsToggle.addEventListener("click", () => {
  const open = ui.settings.hidden;
  ui.settings.hidden = !open;
  ui.settingsToggle.setAttribute("aria-expanded", String(open));
  if (open) ui.system.focus();
});
ui.toggleSidebar.addEventListener("click", () => {
  const open = document.body.classList.toggle("sidebar-open");
  ui.toggleSidebar.setAttribute("aria-expanded", String(open));
  if (open) ui.newChat.focus();
});

function renderAll(): void {
  renderList();
  renderMessages();
  showSettings();
  const conv = current();
  if (conv?.model && [...ui.model.options].some((o) => o.value === conv.model)) ui.model.value = conv.model;
  ui.messages.scrollTop = ui.messages.scrollHeight;
}

renderAll();
void loadModels();
ui.input.focus();
