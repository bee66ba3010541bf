// What the page keeps in the browser's localStorage: the conversations, the settings and the
// API key. Nothing is sent anywhere but to the server that served the page.

import type { ChatMessage, Sampling } from "./api";

/** Numbers measured for one answer. */
export interface Stats {
  /** Tokens generated: the server's usage when it came, else the pieces counted. */
  tokens: number;
  /** Whether `tokens` is the server's count (false: counted pieces, an estimate). */
  exact: boolean;
  promptTokens: number | null;
  /** Milliseconds from sending the request to the first piece of text. */
  ttftMs: number | null;
  /** Milliseconds from sending to the end. */
  totalMs: number;
  /** Generated tokens per second after the first one. */
  tokensPerSecond: number | null;
  finish: string;
}

export interface Message extends ChatMessage {
  stats?: Stats;
}

export interface Conversation {
  id: string;
  title: string;
  model: string;
  system: string;
  created: number;
  updated: number;
  messages: Message[];
}

export interface Settings extends Sampling {
  model: string;
}

/** The shape of an export file (and what import reads). */
export interface ExportFile {
  format: "mica-chat";
  version: 1;
  conversations: Conversation[];
}

const CONVERSATIONS = "mica.conversations.v1";
const SETTINGS = "mica.settings.v1";
const KEY = "mica.apiKey";

export const DEFAULT_SETTINGS: Settings = {
  model: "",
  temperature: 0.7,
  top_p: 0.95,
  max_tokens: 512,
  seed: null,
};

function read<T>(name: string, fallback: T): T {
  try {
    const raw = localStorage.getItem(name);
    return raw === null ? fallback : (JSON.parse(raw) as T);
  } catch {
    return fallback;
  }
}

export function loadConversations(): Conversation[] {
  const list = read<unknown>(CONVERSATIONS, []);
  return Array.isArray(list) ? list.filter(isConversation) : [];
}

export function saveConversations(list: Conversation[]): void {
  localStorage.setItem(CONVERSATIONS, JSON.stringify(list));
}

export function loadSettings(): Settings {
  return { ...DEFAULT_SETTINGS, ...read<Partial<Settings>>(SETTINGS, {}) };
}

export function saveSettings(s: Settings): void {
  localStorage.setItem(SETTINGS, JSON.stringify(s));
}

export function loadKey(): string | null {
  return localStorage.getItem(KEY);
}

export function saveKey(key: string | null): void {
  if (key === null) localStorage.removeItem(KEY);
  else localStorage.setItem(KEY, key);
}

export function newId(): string {
  return `c-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
}

function isMessage(m: any): m is Message {
  return (
    m !== null &&
    typeof m === "object" &&
    (m.role === "system" || m.role === "user" || m.role === "assistant") &&
    typeof m.content === "string"
  );
}

function isConversation(c: any): c is Conversation {
  return (
    c !== null &&
    typeof c === "object" &&
    typeof c.id === "string" &&
    typeof c.title === "string" &&
    Array.isArray(c.messages) &&
    c.messages.every(isMessage)
  );
}

export function exportFile(list: Conversation[]): ExportFile {
  return { format: "mica-chat", version: 1, conversations: list };
}

/**
 * The conversations of an export file, checked field by field; throws an Error saying what
 * is wrong. Missing optional fields get defaults.
 */
export function parseImport(text: string): Conversation[] {
  let data: any;
  try {
    data = JSON.parse(text);
  } catch (e) {
    throw new Error(`not JSON: ${(e as Error).message}`);
  }
  const list = Array.isArray(data) ? data : data?.conversations;
  if (!Array.isArray(list)) throw new Error("no `conversations` list in the file");
  return list.map((c: any, i: number) => {
    if (!c || typeof c !== "object" || !Array.isArray(c.messages)) {
      throw new Error(`conversations[${i}] has no messages list`);
    }
    c.messages.forEach((m: any, j: number) => {
      if (!isMessage(m)) throw new Error(`conversations[${i}].messages[${j}] is not a message`);
    });
    const now = Date.now();
    return {
      id: typeof c.id === "string" ? c.id : newId(),
      title: typeof c.title === "string" ? c.title : "Imported",
      model: typeof c.model === "string" ? c.model : "",
      system: typeof c.system === "string" ? c.system : "",
      created: typeof c.created === "number" ? c.created : now,
      updated: typeof c.updated === "number" ? c.updated : now,
      messages: c.messages.map((m: Message) => ({ role: m.role, content: m.content, stats: m.stats })),
    };
  });
}
