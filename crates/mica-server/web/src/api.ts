// The server's OpenAI-compatible API as the page uses it: the model list and streamed chat
// completions (server-sent events over fetch, so that the request can carry the API key and
// be aborted).

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

export interface Sampling {
  temperature: number;
  top_p: number;
  max_tokens: number | null;
  seed: number | null;
}

export interface Usage {
  prompt_tokens: number;
  completion_tokens: number;
}

/** An HTTP error with the server's message (OpenAI's error shape) and status. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly code: string | null,
  ) {
    super(message);
  }
}

function headers(key: string | null, json: boolean): Headers {
  const h = new Headers();
  if (json) h.set("Content-Type", "application/json");
  if (key) h.set("Authorization", `Bearer ${key}`);
  return h;
}

async function failure(resp: Response): Promise<ApiError> {
  let message = `${resp.status} ${resp.statusText}`;
  let code: string | null = null;
  try {
    const body = await resp.json();
    if (body && body.error) {
      message = body.error.message ?? message;
      code = body.error.code ?? null;
    }
  } catch {
    // Not JSON: keep the status line.
  }
  return new ApiError(resp.status, message, code);
}

/** The ids of the models the server can serve (`GET /v1/models`). */
export async function listModels(key: string | null): Promise<string[]> {
  const resp = await fetch("v1/models", { headers: headers(key, false) });
  if (!resp.ok) throw await failure(resp);
  const body = await resp.json();
  return (body.data as { id: string }[]).map((m) => m.id);
}

export interface StreamHandlers {
  /** A piece of the answer's text. */
  onText(text: string): void;
  /** The usage the server sends last (`stream_options.include_usage`). */
  onUsage(usage: Usage): void;
  /** The finish reason of the answer (`stop`, `length`, `abort`...). */
  onFinish(reason: string): void;
}

/**
 * Streams one chat completion. Resolves when the stream ends (`data: [DONE]`); rejects with
 * an `ApiError` for an HTTP or in-stream error, or with the fetch's `AbortError` when
 * `signal` aborts (the server then cancels the request and frees its sequence).
 */
export async function streamChat(
  key: string | null,
  model: string,
  messages: ChatMessage[],
  sampling: Sampling,
  signal: AbortSignal,
  on: StreamHandlers,
): Promise<void> {
  const body: Record<string, unknown> = {
    model,
    messages,
    stream: true,
    stream_options: { include_usage: true },
    temperature: sampling.temperature,
    top_p: sampling.top_p,
  };
  if (sampling.max_tokens !== null) body.max_tokens = sampling.max_tokens;
  if (sampling.seed !== null) body.seed = sampling.seed;
  const resp = await fetch("v1/chat/completions", {
    method: "POST",
    headers: headers(key, true),
    body: JSON.stringify(body),
    signal,
  });
  if (!resp.ok || !resp.body) throw await failure(resp);
  const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end: number;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, end);
      buf = buf.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        handle(JSON.parse(data), on);
      }
    }
  }
}

function handle(chunk: any, on: StreamHandlers): void {
  if (chunk.error) {
    throw new ApiError(500, chunk.error.message ?? String(chunk.error), chunk.error.code ?? null);
  }
  for (const choice of chunk.choices ?? []) {
    const text = choice.delta?.content;
    if (text) on.onText(text);
    if (choice.finish_reason) on.onFinish(choice.finish_reason);
  }
  if (chunk.usage) on.onUsage(chunk.usage as Usage);
}
