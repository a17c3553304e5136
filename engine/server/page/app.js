// The chat page: the conversations on the left, the open one in the middle, a composer
// below. One reply streams at a time; leaving its conversation (switching, a new chat,
// deleting it) stops it first, as the Stop button does.

import { listModels, streamChat, Unauthorized } from "./api.js";
import { renderMarkdown } from "./markdown.js";
import { Conversations, loadApiKey, loadSettings, saveApiKey, saveSettings } from "./store.js";

const $ = (id) => document.getElementById(id);

const conversations = new Conversations();
let settings = loadSettings();
let apiKey = loadApiKey();
let models = [];
/** While a reply streams: { reply (its message), controller (aborts it), done (settles when
 *  it has ended) }. */
let running = null;

// ---------------------------------------------------------------------------------------
// The server: the model list, and the API key when the server wants one.

/** Lists the models, asking for the key for as long as the server answers 401. */
async function connect() {
  for (;;) {
    try {
      models = await listModels(apiKey);
      break;
    } catch (e) {
      if (!(e instanceof Unauthorized)) {
        showStatus(`Cannot reach the server: ${e.message}`);
        $("model-name").textContent = "not connected";
        return;
      }
      await askForKey(apiKey ? "The server refused the key kept in this browser." : "");
    }
  }
  if (!models.includes(settings.model)) settings.model = models[0] || "";
  $("model").replaceChildren(...models.map((name) => new Option(name, name)));
  $("model").value = settings.model;
  $("model-name").textContent = settings.model;
  showStatus("");
}

/** Shows the key dialog until the user gives a key; keeps it (whether the server takes it
 *  is the next request's to find). */
function askForKey(why) {
  $("key-error").textContent = why;
  $("key-error").hidden = !why;
  $("key-input").value = "";
  $("key-dialog").showModal();
  return new Promise((resolve) => {
    $("key-form").onsubmit = (event) => {
      event.preventDefault();
      const key = $("key-input").value.trim();
      if (!key) return;
      apiKey = key;
      saveApiKey(key);
      $("key-dialog").close();
      $("forget-key").hidden = false;
      resolve();
    };
  });
}

// ---------------------------------------------------------------------------------------
// Replies: each one streamed into the last message of the open conversation.

/** The request for the open conversation as it stands: the system prompt, then every
 *  message, with the settings' sampling. */
function requestFor(conversation) {
  const messages = conversation.messages.map(({ role, content }) => ({ role, content }));
  if (settings.system.trim()) messages.unshift({ role: "system", content: settings.system });
  const { model, temperature, top_p, max_tokens } = settings;
  const request = { model, messages, temperature, top_p };
  if (max_tokens) request.max_tokens = max_tokens;
  return request;
}

/** Streams a reply to the open conversation, whose last message is the user's. */
async function generate() {
  const conversation = conversations.current();
  const request = requestFor(conversation);
  const reply = { role: "assistant", content: "" };
  conversation.messages.push(reply);
  const controller = new AbortController();
  let ended;
  running = { reply, controller, done: new Promise((resolve) => (ended = resolve)) };
  renderMessages();
  showControls();
  try {
    reply.finish = await streamChat(request, apiKey, controller.signal, (piece) => {
      reply.content += piece;
      renderReplySoon(reply);
    });
  } catch (e) {
    if (e.name === "AbortError") {
      reply.finish = "stopped";
    } else if (e instanceof Unauthorized) {
      // The key changed on the server: ask, then send the conversation again.
      conversation.messages.pop();
      running = null;
      ended();
      await askForKey("The server refused the key.");
      return generate();
    } else {
      reply.finish = "error";
      reply.error = e.message;
    }
  }
  running = null;
  ended();
  if (!conversations.save()) showStatus("The browser's storage is full: delete old chats.");
  renderMessages();
  renderConversations();
  showControls();
}

/** Stops the streaming reply, if any, and waits until it has ended. */
async function stop() {
  if (!running) return;
  const { controller, done } = running;
  controller.abort();
  await done;
}

/** Sends the composer's text as the next user message. */
async function send() {
  await connected;
  const text = $("prompt").value;
  if (!text.trim() || running) return;
  $("prompt").value = "";
  const conversation = conversations.current();
  conversation.messages.push({ role: "user", content: text });
  conversations.save();
  renderConversations();
  await generate();
}

/** Replaces the last reply with a new one (or answers a user message left without one). */
async function regenerate() {
  const { messages } = conversations.current();
  if (running || messages.length === 0) return;
  if (messages.at(-1).role === "assistant") messages.pop();
  await generate();
}

/** Puts `text` in place of user message `index`, drops everything after it, and sends. */
async function resend(index, text) {
  const { messages } = conversations.current();
  messages.splice(index, messages.length - index, { role: "user", content: text });
  conversations.save();
  await generate();
}

// ---------------------------------------------------------------------------------------
// Drawing.

function showStatus(text) {
  $("status").textContent = text;
}

/** Send or Stop in one place; Regenerate when there is something to regenerate. */
function showControls() {
  const { messages } = conversations.current();
  $("send").hidden = Boolean(running);
  $("stop").hidden = !running;
  $("regenerate").disabled = Boolean(running) || messages.length === 0;
}

/** A new `tag` element with `props` set on it (`dataset` merged) and `children` in it. */
function element(tag, props = {}, ...children) {
  const { dataset = {}, ...rest } = props;
  const node = Object.assign(document.createElement(tag), rest);
  Object.assign(node.dataset, dataset);
  node.append(...children);
  return node;
}

function renderConversations() {
  const items = conversations.list.map((c) =>
    element(
      "li",
      {
        className: c.id === conversations.currentId ? "open" : "",
        dataset: { testid: "conversation" },
      },
      element("button", {
        className: "title",
        textContent: c.title,
        onclick: () => switchTo(c.id),
      }),
      element("button", {
        className: "delete",
        title: "Delete this chat",
        textContent: "×",
        onclick: () => removeConversation(c.id),
        dataset: { testid: "delete-conversation" },
      }),
    ),
  );
  $("conversations").replaceChildren(...items);
}

/** What a reply's view says about how it ended (a reply that ended by itself says nothing). */
const FINISH_NOTES = {
  stopped: "stopped",
  length: "cut at max tokens",
};

function renderMessages() {
  const { messages } = conversations.current();
  const views = messages.map((message, index) => {
    const who = message.role === "user" ? "You" : "rustle";
    const head = element("header", {}, element("span", { className: "role", textContent: who }));
    const content = element("div", {
      className: "content",
      dataset: { testid: "message-content" },
    });
    const view = element(
      "article",
      { className: `message ${message.role}`, dataset: { testid: "message", role: message.role } },
      head,
      content,
    );
    if (message.role === "user" && !running) head.append(editButton(view, index));
    fillMessage(view, message);
    return view;
  });
  $("messages").replaceChildren(...views);
  scrollToEnd();
}

/** The message's text and how it ended, into its view. */
function fillMessage(view, message) {
  const content = view.querySelector(".content");
  if (message.role === "user") {
    content.textContent = message.content; // as typed, not rendered
  } else {
    content.innerHTML = renderMarkdown(message.content);
  }
  view.dataset.finish = message.finish || (running?.reply === message ? "streaming" : "");
  const note = message.finish === "error" ? message.error : FINISH_NOTES[message.finish];
  view.querySelector(".finish")?.remove();
  if (note) {
    view.append(
      element("p", { className: "finish", textContent: note, dataset: { testid: "finish" } }),
    );
  }
}

/** Redraws the streaming reply at most once a frame, however fast its pieces come. */
let redrawPending = false;
function renderReplySoon(reply) {
  if (redrawPending) return;
  redrawPending = true;
  requestAnimationFrame(() => {
    redrawPending = false;
    const view = $("messages").lastElementChild;
    if (view && conversations.current().messages.at(-1) === reply) {
      const follow = nearEnd();
      fillMessage(view, reply);
      if (follow) scrollToEnd();
    }
  });
}

/** Whether the reader is at the end of the messages (then new text keeps them there). */
function nearEnd() {
  const m = $("messages");
  return m.scrollHeight - m.scrollTop - m.clientHeight < 80;
}

function scrollToEnd() {
  const m = $("messages");
  m.scrollTop = m.scrollHeight;
}

/** An Edit button for user message `index`: its text in a box, then Send or Cancel. */
function editButton(view, index) {
  const button = element("button", {
    className: "edit",
    textContent: "Edit",
    dataset: { testid: "edit" },
  });
  button.onclick = () => {
    const text = conversations.current().messages[index].content;
    const box = element("textarea", {
      value: text,
      rows: Math.min(10, text.split("\n").length + 1),
      dataset: { testid: "edit-input" },
    });
    const send = () => box.value.trim() && resend(index, box.value);
    const editor = element(
      "div",
      { className: "editor" },
      box,
      element("button", { textContent: "Send", onclick: send, dataset: { testid: "edit-send" } }),
      element("button", { textContent: "Cancel", onclick: renderMessages }),
    );
    view.querySelector(".content").replaceWith(editor);
    button.remove();
    box.focus();
  };
  return button;
}

// ---------------------------------------------------------------------------------------
// Conversations and settings.

async function switchTo(id) {
  await stop();
  conversations.select(id);
  renderAll();
}

async function removeConversation(id) {
  if (id === conversations.currentId) await stop();
  conversations.remove(id);
  renderAll();
}

function renderAll() {
  renderConversations();
  renderMessages();
  showControls();
}

function openSettings() {
  $("system").value = settings.system;
  $("temperature").value = settings.temperature;
  $("top-p").value = settings.top_p;
  $("max-tokens").value = settings.max_tokens ?? "";
  $("forget-key").hidden = !apiKey;
  $("settings").showModal();
}

/** Takes the settings from the form. A field left empty or out of its range keeps what it
 *  was, except max tokens, where empty means the server's default. */
function readSettings() {
  const number = (id, min, max, fallback) => {
    const v = $(id).valueAsNumber;
    return Number.isFinite(v) && v >= min && v <= max ? v : fallback;
  };
  const maxTokens = $("max-tokens").valueAsNumber;
  settings = {
    model: $("model").value || settings.model,
    system: $("system").value,
    temperature: number("temperature", 0, 2, settings.temperature),
    top_p: number("top-p", 0.01, 1, settings.top_p),
    max_tokens: Number.isInteger(maxTokens) && maxTokens >= 1 ? maxTokens : null,
  };
  saveSettings(settings);
  $("model-name").textContent = settings.model;
}

// ---------------------------------------------------------------------------------------
// Wiring.

$("composer").onsubmit = (event) => {
  event.preventDefault();
  send();
};
$("prompt").onkeydown = (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
};
$("stop").onclick = stop;
$("regenerate").onclick = regenerate;
$("new-chat").onclick = async () => {
  await stop();
  conversations.create();
  renderAll();
  $("prompt").focus();
};
$("open-settings").onclick = openSettings;
$("settings-form").onsubmit = (event) => {
  event.preventDefault();
  $("settings").close();
};
// Done and Escape alike keep what the form says.
$("settings").onclose = readSettings;
$("forget-key").onclick = () => {
  apiKey = "";
  saveApiKey("");
  $("forget-key").hidden = true;
};
// The key dialog has no way out but a key: without one nothing works.
$("key-dialog").oncancel = (event) => event.preventDefault();

renderAll();
/** Settles once the model list is in (or the server could not be reached). */
const connected = connect();
