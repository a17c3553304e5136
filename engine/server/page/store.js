// What the page keeps in the browser's localStorage: the conversations, the settings and
// the API key. The server keeps nothing between requests, so a conversation lives here and
// is sent whole with each request.
//
// A conversation: { id, title, updated (ms since 1970), messages }, and a message:
// { role: "user" | "assistant", content, finish? } where finish is how a reply ended:
// "stop" (the model's end), "length" (max tokens), "stopped" (the Stop button) or
// "error" (then `error` holds the server's message).

const KEYS = {
  conversations: "rustle.conversations",
  current: "rustle.current",
  settings: "rustle.settings",
  apiKey: "rustle.apiKey",
};

/** Settings before the user changes any. `max_tokens: null` leaves the server's default:
 *  the rest of the context. An empty `model` means the first one the server lists. */
export const DEFAULT_SETTINGS = {
  model: "",
  system: "",
  temperature: 0.7,
  top_p: 1,
  max_tokens: null,
};

/** The JSON under `key`, or `fallback` when there is none or it does not parse (written by
 *  another version of the page, or by hand). */
function read(key, fallback) {
  try {
    const text = localStorage.getItem(key);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;
  }
}

/** Writes `value` as JSON; false when the browser refuses (its storage is full). */
function write(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

export function loadSettings() {
  return { ...DEFAULT_SETTINGS, ...read(KEYS.settings, {}) };
}

export function saveSettings(settings) {
  return write(KEYS.settings, settings);
}

export function loadApiKey() {
  return localStorage.getItem(KEYS.apiKey) || "";
}

/** Keeps `key`, or forgets the one kept when `key` is empty. */
export function saveApiKey(key) {
  if (key) localStorage.setItem(KEYS.apiKey, key);
  else localStorage.removeItem(KEYS.apiKey);
}

/** A title from the first words of the first message. */
function titleOf(text) {
  const line = text.trim().split("\n")[0];
  return line.length > 40 ? `${line.slice(0, 40).trimEnd()}…` : line || "New chat";
}

/** The conversations, newest first, and which one is open. */
export class Conversations {
  constructor() {
    const list = read(KEYS.conversations, []);
    this.list = Array.isArray(list) ? list : [];
    this.currentId = localStorage.getItem(KEYS.current);
    if (!this.current()) this.create();
  }

  /** The open conversation. */
  current() {
    return this.list.find((c) => c.id === this.currentId);
  }

  /** Opens a new, empty conversation (or the empty one already at the top). */
  create() {
    const top = this.list[0];
    if (top && top.messages.length === 0) {
      this.select(top.id);
      return top;
    }
    // Not crypto.randomUUID: it exists only on https or localhost pages, and the server may
    // be reached at any address.
    const id = `${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 8)}`;
    const conversation = { id, title: "New chat", updated: Date.now(), messages: [] };
    this.list.unshift(conversation);
    this.select(id);
    return conversation;
  }

  select(id) {
    this.currentId = id;
    localStorage.setItem(KEYS.current, id);
  }

  remove(id) {
    this.list = this.list.filter((c) => c.id !== id);
    if (this.currentId === id) {
      if (this.list.length > 0) this.select(this.list[0].id);
      else this.create();
    }
    this.save();
  }

  /** Writes every conversation back, after retitling the open one and moving it to the
   *  top; false when the browser's storage is full. */
  save() {
    const open = this.current();
    if (open) {
      const first = open.messages.find((m) => m.role === "user");
      open.title = first ? titleOf(first.content) : "New chat";
      open.updated = Date.now();
      this.list = [open, ...this.list.filter((c) => c !== open)];
    }
    return write(KEYS.conversations, this.list);
  }
}
