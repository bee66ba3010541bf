"""OpenAI-shaped results: the dicts ``create_completion`` and ``create_chat_completion``
return (and the chunks they stream), in the shape llama-cpp-python and the OpenAI SDK's
types use, built from the native event stream."""

from __future__ import annotations

import time
import uuid
from typing import Any, Dict, Iterator, List, Optional


def finish_reason(reason: str) -> str:
    """The engine's finish reason as OpenAI names it."""
    return "length" if reason in ("length", "context") else "stop"


def usage(prompt: int, cached: int, completion: int) -> Dict[str, Any]:
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def tool_calls(calls: List[Any]) -> List[Dict[str, Any]]:
    """Parsed calls ``[(name, arguments_json)]`` as OpenAI's ``tool_calls`` entries."""
    return [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": name, "arguments": args}}
        for name, args in calls
    ]


class Gathered:
    """Every completion of a finished request: text, tokens, log-probabilities, finish."""

    def __init__(self, n: int) -> None:
        self.text: List[str] = [""] * n
        self.tokens: List[List[int]] = [[] for _ in range(n)]
        self.logprobs: List[List[Any]] = [[] for _ in range(n)]
        self.finish: List[str] = ["stop"] * n
        self.usage = usage(0, 0, 0)

    def feed(self, ev: tuple) -> None:
        kind = ev[0]
        if kind == "token":
            _, i, tok, text, lp = ev
            self.text[i] += text
            self.tokens[i].append(tok)
            if lp is not None:
                self.logprobs[i].append(lp)
        elif kind == "done":
            _, i, reason, text = ev
            self.text[i] += text
            self.finish[i] = finish_reason(reason)
        elif kind == "finished":
            self.usage = usage(ev[1], ev[2], ev[3])


def gather(events: Any, n: int) -> Gathered:
    g = Gathered(n)
    try:
        for ev in events:
            g.feed(ev)
    finally:
        events.close()
    return g


class Pieces:
    """Token ids to the text and bytes of each token, for log-probability entries."""

    def __init__(self, native: Any) -> None:
        self._native = native

    def text_bytes(self, tok: int) -> "tuple[str, List[int]]":
        b = self._native.token_piece(tok) or b""
        return b.decode("utf-8", errors="replace"), list(b)

    def chat_entry(self, tok: int, lp: Any) -> Dict[str, Any]:
        logprob, top = lp
        text, b = self.text_bytes(tok)
        tops = []
        for t, v in top:
            tt, tb = self.text_bytes(t)
            tops.append({"token": tt, "logprob": v, "bytes": tb})
        return {"token": text, "logprob": logprob, "bytes": b, "top_logprobs": tops}

    def legacy(self, tokens: List[int], lps: List[Any], offset: int = 0) -> Dict[str, Any]:
        texts, token_lps, tops, offsets = [], [], [], []
        for tok, (logprob, top) in zip(tokens, lps):
            text, _ = self.text_bytes(tok)
            offsets.append(offset)
            offset += len(text)
            texts.append(text)
            token_lps.append(logprob)
            tops.append({self.text_bytes(t)[0]: v for t, v in top})
        return {
            "tokens": texts,
            "token_logprobs": token_lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def completion(
    events: Any, n: int, model: str, pieces: Pieces, logprobs: bool, echo: Optional[str]
) -> Dict[str, Any]:
    g = gather(events, n)
    choices = []
    for i in range(n):
        text = (echo or "") + g.text[i]
        lp = pieces.legacy(g.tokens[i], g.logprobs[i], len(echo or "")) if logprobs else None
        choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": g.finish[i]})
    return {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": g.usage,
    }


def completion_chunks(
    events: Any, model: str, pieces: Pieces, logprobs: bool, include_usage: bool
) -> Iterator[Dict[str, Any]]:
    cid, created = new_id("cmpl"), int(time.time())

    def chunk(choices: list, use: Optional[dict] = None) -> Dict[str, Any]:
        d = {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if use is not None:
            d["usage"] = use
        return d

    try:
        for ev in events:
            if ev[0] == "token":
                _, i, tok, text, lp = ev
                lpd = pieces.legacy([tok], [lp]) if (logprobs and lp is not None) else None
                yield chunk([{"index": i, "text": text, "logprobs": lpd, "finish_reason": None}])
            elif ev[0] == "done":
                _, i, reason, text = ev
                yield chunk(
                    [{"index": i, "text": text, "logprobs": None,
                      "finish_reason": finish_reason(reason)}]
                )
            elif ev[0] == "finished" and include_usage:
                yield chunk([], usage(ev[1], ev[2], ev[3]))
    finally:
        events.close()


def chat_completion(
    events: Any, n: int, model: str, pieces: Pieces, logprobs: bool, tools: Any = None
) -> Dict[str, Any]:
    """``tools``: the request's ``NativeStructured`` when it has tools (calls in the text
    become ``message.tool_calls``)."""
    g = gather(events, n)
    choices = []
    for i in range(n):
        lp = None
        if logprobs:
            lp = {"content": [pieces.chat_entry(t, l) for t, l in zip(g.tokens[i], g.logprobs[i])]}
        message: Dict[str, Any] = {"role": "assistant", "content": g.text[i]}
        finish = g.finish[i]
        if tools is not None:
            content, calls = tools.parse(g.text[i])
            if calls:
                message = {"role": "assistant", "content": content or None,
                           "tool_calls": tool_calls(calls)}
                finish = "tool_calls"
        choices.append(
            {
                "index": i,
                "message": message,
                "logprobs": lp,
                "finish_reason": finish,
            }
        )
    return {
        "id": new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": g.usage,
    }


def chat_chunks(
    events: Any, n: int, model: str, pieces: Pieces, logprobs: bool, include_usage: bool,
    tools: Any = None,
) -> Iterator[Dict[str, Any]]:
    """``tools``: as in ``chat_completion``. Content that may be the start of a call is
    held back until it is certain; calls come as one ``tool_calls`` delta at the end, as
    ``mica serve`` streams them."""
    cid, created = new_id("chatcmpl"), int(time.time())
    streams = [tools.stream() for _ in range(n)] if tools is not None else None

    def chunk(choices: list, use: Optional[dict] = None) -> Dict[str, Any]:
        d = {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": choices,
        }
        if use is not None:
            d["usage"] = use
        return d

    try:
        # The role comes first, once per completion, as OpenAI and llama-cpp-python send it.
        for i in range(n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                          "logprobs": None, "finish_reason": None}])
        for ev in events:
            if ev[0] == "token":
                _, i, tok, text, lp = ev
                lpd = None
                if logprobs and lp is not None:
                    lpd = {"content": [pieces.chat_entry(tok, lp)]}
                if streams is not None:
                    text = streams[i].push(text)
                if text or lpd is not None:
                    yield chunk([{"index": i, "delta": {"content": text}, "logprobs": lpd,
                                  "finish_reason": None}])
            elif ev[0] == "done":
                _, i, reason, text = ev
                finish = finish_reason(reason)
                calls: List[Any] = []
                if streams is not None:
                    text = streams[i].push(text)
                    rest, calls = streams[i].finish()
                    text += rest
                if text:
                    yield chunk([{"index": i, "delta": {"content": text}, "logprobs": None,
                                  "finish_reason": None}])
                if calls:
                    deltas = [dict(c, index=j) for j, c in enumerate(tool_calls(calls))]
                    yield chunk([{"index": i, "delta": {"tool_calls": deltas}, "logprobs": None,
                                  "finish_reason": None}])
                    finish = "tool_calls"
                yield chunk([{"index": i, "delta": {}, "logprobs": None,
                              "finish_reason": finish}])
            elif ev[0] == "finished" and include_usage:
                yield chunk([], usage(ev[1], ev[2], ev[3]))
    finally:
        events.close()
