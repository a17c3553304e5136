// The server's OpenAI-compatible API as the page uses it: the model list, and chat
// completions streamed as server-sent events. Same origin: the page and the API are served
// by one `rustle serve`.

/** The server answered 401: it wants a key (`--api-key`) and this was not it. */
export class Unauthorized extends Error {
  constructor() {
    super("The server wants an API key.");
  }
}

function headers(apiKey) {
  const h = { "Content-Type": "application/json" };
  if (apiKey) h.Authorization = `Bearer ${apiKey}`;
  return h;
}

/** The response when it is a success; else throws `Unauthorized` for a 401, or an Error
 *  with the server's own message (its errors take OpenAI's shape). */
async function checked(response) {
  if (response.ok) return response;
  if (response.status === 401) throw new Unauthorized();
  let message = `${response.status} ${response.statusText}`;
  try {
    message = (await response.json()).error.message || message;
  } catch {
    // not an error of the server's own: keep the status line
  }
  throw new Error(message);
}

/** The names of the models the server serves (rustle serves one). */
export async function listModels(apiKey) {
  const response = await checked(await fetch("/v1/models", { headers: headers(apiKey) }));
  return (await response.json()).data.map((m) => m.id);
}

/**
 * Runs one chat completion as a stream: `onText(piece)` for each piece of the reply as it
 * comes; resolves to the finish reason ("stop" or "length"). Aborting `signal` (the Stop
 * button) closes the connection, which ends the request on the server too; the promise
 * then rejects with an AbortError.
 */
export async function streamChat(request, apiKey, signal, onText) {
  const response = await checked(
    await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(apiKey),
      body: JSON.stringify({ ...request, stream: true }),
      signal,
    }),
  );
  let finish = null;
  for await (const data of events(response.body)) {
    if (data === "[DONE]") return finish;
    const chunk = JSON.parse(data);
    // A failure after the stream began (the server's time limit) comes as an event.
    if (chunk.error) throw new Error(chunk.error.message);
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.delta.content) onText(choice.delta.content);
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  throw new Error("The connection closed before the reply ended.");
}

/** The `data:` of each server-sent event of `body`, as each arrives. An event ends at a
 *  blank line; one may be split across reads, so the unfinished tail waits for the next. */
async function* events(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    const blocks = buffer.split(/\r?\n\r?\n/);
    buffer = blocks.pop();
    for (const block of blocks) {
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      // Keep-alive comments (`: ...`) carry no data.
      if (data) yield data;
    }
  }
}
