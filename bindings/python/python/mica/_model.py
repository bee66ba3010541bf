"""``mica.Model``: an opened model and everything done with it from Python."""

from __future__ import annotations

import json
import os
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy as np

from . import _mica, _openai
from ._errors import InvalidParameter

Message = Union[Mapping[str, Any], Tuple[str, str]]
Prompt = Union[str, Sequence[int]]
Progress = Callable[[Dict[str, Any]], None]

# The keyword arguments every generation method takes (see ``Model.generate``).
SAMPLING_ARGS = (
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "penalty_last_n",
    "seed",
    "stop",
    "ignore_eos",
    "logit_bias",
    "lane",
    "typical_p",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
)


def _model_name(path: str) -> str:
    """A model's API name: its file name without extension, or its folder's name."""
    base = os.path.basename(os.path.normpath(path))
    if os.path.isdir(path):
        return base
    stem, _ = os.path.splitext(base)
    return stem


def _content(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for p in content:
            if isinstance(p, str):
                parts.append(p)
            elif isinstance(p, Mapping) and p.get("type") == "text":
                parts.append(str(p.get("text", "")))
            else:
                raise InvalidParameter(f"unsupported message content part: {p!r}")
        return "".join(parts)
    raise InvalidParameter(f"message content must be text, got {type(content).__name__}")


def _messages(messages: Iterable[Message]) -> str:
    """A conversation as the JSON the native module reads: OpenAI messages with text
    content, ``tool_calls`` on assistant turns, ``tool_call_id`` / ``name`` on tool turns."""
    out = []
    for m in messages:
        if isinstance(m, tuple):
            role, content = m
            out.append({"role": str(role), "content": _content(content)})
            continue
        if not isinstance(m, Mapping):
            raise InvalidParameter(f"a message is a dict or a (role, content) pair, got {m!r}")
        if "role" not in m:
            raise InvalidParameter(f"a message needs a role: {m!r}")
        msg: Dict[str, Any] = {"role": str(m["role"]), "content": _content(m.get("content"))}
        calls = m.get("tool_calls")
        if calls:
            msg["tool_calls"] = [_plain(c) for c in calls]
        for key in ("tool_call_id", "name"):
            if m.get(key) is not None:
                msg[key] = str(m[key])
        out.append(msg)
    return json.dumps(out)


def _plain(obj: Any) -> Any:
    """A value as plain JSON data: pydantic models (the ``openai`` SDK's message and tool
    types) through ``model_dump``."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(exclude_none=True)
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _invalid(param: str, message: str) -> InvalidParameter:
    err = InvalidParameter(message)
    err.param = param
    return err


def _constraint(response_format: Optional[Mapping[str, Any]], grammar: Optional[str],
                regex: Optional[str], choice: Optional[Sequence[str]]
                ) -> Optional[Tuple[str, str]]:
    """The output constraint of a chat request as ``(kind, text)``: OpenAI's
    ``response_format`` or one of mica's ``grammar``, ``regex``, ``choice``."""
    given = []
    if response_format is not None:
        rf = _plain(response_format)
        kind = rf.get("type", "text") if isinstance(rf, Mapping) else None
        if kind == "json_object":
            given.append(("json_object", ""))
        elif kind == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, Mapping) or "schema" not in js:
                raise _invalid("response_format",
                               "response_format json_schema needs json_schema.schema")
            given.append(("json_schema", json.dumps(js["schema"])))
        elif kind != "text":
            raise _invalid("response_format",
                           f"response_format type must be text, json_object or json_schema, "
                           f"not {kind!r}")
    if grammar is not None:
        given.append(("grammar", str(grammar)))
    if regex is not None:
        given.append(("regex", str(regex)))
    if choice is not None:
        if isinstance(choice, str):
            raise _invalid("choice", "choice must be a list of strings")
        given.append(("choice", json.dumps(list(choice))))
    if len(given) > 1:
        raise _invalid(given[1][0] if given[1][0] in ("grammar", "regex", "choice")
                       else "response_format", "give one output constraint per request")
    return given[0] if given else None


def _sampling(kw: Dict[str, Any]) -> Dict[str, Any]:
    """Checks and normalizes the sampling keyword arguments for ``NativeModel.submit``."""
    unknown = set(kw) - set(SAMPLING_ARGS)
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    out = {k: v for k, v in kw.items() if v is not None}
    stop = out.get("stop")
    if isinstance(stop, str):
        out["stop"] = [stop]
    elif stop is not None:
        out["stop"] = list(stop)
    bias = out.get("logit_bias")
    if bias is not None:
        out["logit_bias"] = [(int(t), float(b)) for t, b in dict(bias).items()]
    breakers = out.get("dry_sequence_breakers")
    if isinstance(breakers, str):
        out["dry_sequence_breakers"] = [breakers]
    elif breakers is not None:
        out["dry_sequence_breakers"] = list(breakers)
    if "max_tokens" in out and out["max_tokens"] < 0:
        raise InvalidParameter("max_tokens must not be negative")
    return out


class Model:
    """An opened model.

    ``name_or_path`` is what ``mica run -m`` takes: a GGUF or ``.mica`` file, a Hugging Face
    folder, a model in the store (``mica list``), or a catalog / ``hf:ORG/REPO[:FILE]`` name
    pulled into the store first; ``None`` is the default model. The store is
    ``models_dir``, else ``$MICA_HOME/models``, else ``<user cache dir>/mica/models``.

    ``n_ctx`` is the context of one sequence (default: the model's training context, at
    most 4096); ``n_threads`` the compute threads (default: physical cores); ``kv_mem`` the
    bytes of the paged KV cache shared by concurrent requests (default 512 MiB).

    ``lora`` applies LoRA adapters unmerged, each a path (a PEFT folder or a GGUF LoRA file)
    or a ``(path, scale)`` pair; several add up. An adapter that does not fit the model
    raises ``mica.MicaError`` naming it.

    ``cache_type_k`` / ``cache_type_v`` choose the KV cache's key and value types with
    llama.cpp's names (``"f16"``, the default, ``"q8_0"``, ``"q4_0"``, ``"q4_1"``,
    ``"q5_0"``, ``"q5_1"``, ``"iq4_nl"``, ``"bf16"``, ``"f32"``): ``q8_0`` halves the cache,
    ``q4_0`` takes about a quarter of it. An unknown type, or one whose blocks do not divide
    the model's head size, raises ``mica.InvalidParameter``.

    One ``Model`` can be used from several threads at once: every generation goes through
    one engine that batches concurrent requests, and all computing happens with the GIL
    released.
    """

    def __init__(
        self,
        name_or_path: Optional[Union[str, "os.PathLike[str]"]] = None,
        *,
        n_ctx: Optional[int] = None,
        n_threads: Optional[int] = None,
        kv_mem: Optional[int] = None,
        max_waiting: Optional[int] = None,
        prefix_caching: bool = True,
        models_dir: Optional[Union[str, "os.PathLike[str]"]] = None,
        progress: Optional[Progress] = None,
        name: Optional[str] = None,
        lora: Sequence[Union[str, "os.PathLike[str]", Tuple[Union[str, "os.PathLike[str]"], float]]] = (),
        cache_type_k: Optional[str] = None,
        cache_type_v: Optional[str] = None,
    ) -> None:
        arg = None if name_or_path is None else os.fspath(name_or_path)
        adapters = []
        for a in lora:
            if isinstance(a, tuple):
                adapters.append((os.fspath(a[0]), float(a[1])))
            else:
                adapters.append((os.fspath(a), 1.0))
        path = _mica.resolve(arg, models_dir=models_dir, progress=progress)
        self._native = _mica.NativeModel(
            path,
            n_ctx=n_ctx,
            n_threads=n_threads,
            kv_mem=kv_mem,
            max_waiting=max_waiting,
            prefix_caching=prefix_caching,
            lora=adapters,
            cache_type_k=cache_type_k,
            cache_type_v=cache_type_v,
        )
        self._pieces = _openai.Pieces(self._native)
        #: The name results report as ``model`` (default: the file name without extension).
        self.name: str = name or _model_name(str(path))

    def __repr__(self) -> str:
        return f"mica.Model({str(self.path)!r})"

    # --- what the model is -------------------------------------------------------------

    @property
    def path(self) -> str:
        """The file or folder the model was opened from."""
        return str(self._native.path)

    @property
    def n_vocab(self) -> int:
        """Size of the vocabulary (the length of a logits row)."""
        return self._native.n_vocab

    @property
    def n_ctx(self) -> int:
        """Positions one sequence may hold (prompt and completion)."""
        return self._native.n_ctx

    @property
    def n_ctx_train(self) -> int:
        """The context the model was trained with."""
        return self._native.n_ctx_train

    @property
    def architecture(self) -> str:
        """The architecture name from the file (``llama``, ``qwen2``, ...)."""
        return self._native.architecture

    # --- tokens and logits -------------------------------------------------------------

    def tokenize(
        self, text: Union[str, bytes], add_special: bool = True, parse_special: bool = True
    ) -> List[int]:
        """Text to token ids as llama.cpp tokenizes a prompt: BOS added where the model asks
        for it (``add_special``), special tokens written in the text parsed as such
        (``parse_special``). ``bytes`` are decoded as UTF-8."""
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8")
        return self._native.tokenize(text, add_special, parse_special)

    def detokenize(self, ids: Sequence[int]) -> str:
        """Token ids to text (special tokens included as their text)."""
        return self._native.detokenize(list(ids))

    def token_bytes(self, token: int) -> Optional[bytes]:
        """The bytes one token stands for; ``None`` outside the vocabulary."""
        return self._native.token_piece(int(token))

    def logits(self, ids: Prompt, all: bool = False) -> np.ndarray:
        """Raw logits (``float32``) after ``ids`` (token ids, or text to tokenize),
        evaluated from an empty cache: the next token's, shape ``[n_vocab]``, or with
        ``all=True`` every position's, shape ``[len(ids), n_vocab]``. The same numbers the
        engine samples from, bit for bit."""
        return self._native.logits(self._ids(ids), all)

    def embed(self, texts: Union[str, Sequence[str]], normalize: bool = True) -> np.ndarray:
        """Embeddings of ``texts`` (one string or a list), shape ``[len(texts), n_embd]``,
        ``float32``: pooled as the model declares (a decoder LM that declares nothing on
        its last token, as ``mica embed`` and the server's embedding routes), L2-normalized
        unless ``normalize=False``. Runs without the GIL."""
        if isinstance(texts, str):
            texts = [texts]
        return self._native.embed([str(t) for t in texts], normalize)

    # --- generation --------------------------------------------------------------------

    def _ids(self, prompt: Prompt) -> List[int]:
        if isinstance(prompt, str):
            return self._native.tokenize(prompt, True, True)
        return [int(t) for t in prompt]

    def _submit(self, ids: List[int], kw: Dict[str, Any], n: int = 1,
                logprobs: Optional[int] = None, structured: Any = None) -> Any:
        return self._native.submit(ids, n=n, logprobs=logprobs, structured=structured,
                                   **_sampling(kw))

    def generate(self, prompt: Prompt, **sampling: Any) -> str:
        """Generates a continuation of ``prompt`` (text, tokenized as ``tokenize`` does, or
        token ids) and returns its text.

        Sampling keywords (llama.cpp's defaults): ``max_tokens`` (128; ``None``: until the
        context is full), ``temperature`` (0.8; 0 is greedy), ``top_k`` (40), ``top_p``
        (0.95), ``min_p`` (0.05), ``repeat_penalty`` (1.0), ``presence_penalty`` (0),
        ``frequency_penalty`` (0), ``penalty_last_n`` (64), ``seed`` (random), ``stop`` (a
        string or a list), ``ignore_eos`` (False), ``logit_bias`` ({token: bias}), ``lane``
        (``"interactive"``, ``"background"`` or ``"bulk"``: the request's priority), and
        the rest of llama.cpp's chain, off by default: ``typical_p`` (1.0),
        ``xtc_probability`` (0) with ``xtc_threshold`` (0.1), ``dry_multiplier`` (0) with
        ``dry_base`` (1.75), ``dry_allowed_length`` (2), ``dry_penalty_last_n`` (-1: the
        whole context) and ``dry_sequence_breakers`` (``["\\n", ":", "\"", "*"]``)."""
        sampling.setdefault("max_tokens", 128)
        events = self._submit(self._ids(prompt), sampling)
        return _openai.gather(events, 1).text[0]

    def stream(self, prompt: Prompt, **sampling: Any) -> Iterator[str]:
        """Like ``generate``, yielding the text as it becomes final. Waiting releases the
        GIL; leaving the loop early (``break``, an exception, or ``close()`` on the
        generator) cancels the request and frees its sequence at once."""
        sampling.setdefault("max_tokens", 128)
        events = self._submit(self._ids(prompt), sampling)
        return self._texts(events)

    @staticmethod
    def _texts(events: Any) -> Iterator[str]:
        try:
            for ev in events:
                # ("token", i, id, text, logprob) and ("done", i, reason, text) carry text.
                if ev[0] in ("token", "done") and ev[3]:
                    yield ev[3]
        finally:
            events.close()

    def chat_prompt(self, messages: Iterable[Message]) -> List[int]:
        """The prompt tokens of a conversation, rendered with the model's chat template
        (ChatML when the file has none) and ready for the assistant's answer."""
        return self._native.chat_prompt(_messages(messages))

    def _structured(self, response_format: Any = None, tools: Any = None,
                    tool_choice: Any = None, parallel_tool_calls: Optional[bool] = None,
                    grammar: Optional[str] = None, regex: Optional[str] = None,
                    choice: Optional[Sequence[str]] = None) -> Any:
        """The request's compiled constraint and tools (``None`` when it has neither)."""
        constraint = _constraint(response_format, grammar, regex, choice)
        if constraint is None and not tools and tool_choice in (None, "auto"):
            return None
        return self._native.structured(
            constraint=constraint,
            tools=json.dumps(_plain(list(tools))) if tools else None,
            tool_choice=json.dumps(_plain(tool_choice)) if tool_choice is not None else None,
            parallel_tool_calls=bool(parallel_tool_calls),
        )

    def chat(self, messages: Union[str, Iterable[Message]], *, stream: bool = False,
             **sampling: Any) -> Union[str, Iterator[str]]:
        """The assistant's answer to a conversation (a list of ``{"role", "content"}``
        dicts or ``(role, content)`` pairs; a string is one user message). Takes the
        sampling keywords of ``generate``; ``stream=True`` yields the text as it comes."""
        if isinstance(messages, str):
            messages = [("user", messages)]
        ids = self.chat_prompt(messages)
        sampling.setdefault("max_tokens", 128)
        events = self._submit(ids, sampling)
        if stream:
            return self._texts(events)
        return _openai.gather(events, 1).text[0]

    # --- OpenAI-shaped API (as llama-cpp-python's) -------------------------------------

    def create_completion(
        self,
        prompt: Prompt,
        *,
        max_tokens: Optional[int] = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        top_k: int = 40,
        stop: Optional[Union[str, List[str]]] = None,
        seed: Optional[int] = None,
        repeat_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        typical_p: float = 1.0,
        logit_bias: Optional[Mapping[int, float]] = None,
        ignore_eos: bool = False,
        logprobs: Optional[int] = None,
        echo: bool = False,
        n: int = 1,
        stream: bool = False,
        stream_options: Optional[Mapping[str, Any]] = None,
        model: Optional[str] = None,
    ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """A text completion as the OpenAI API (and llama-cpp-python) returns it:
        ``{"id", "object": "text_completion", "created", "model", "choices": [{"text",
        "index", "logprobs", "finish_reason"}], "usage"}``. ``stream=True`` returns an
        iterator of chunks of the same shape (with ``stream_options={"include_usage":
        True}``, a last chunk carries the usage). ``logprobs=k`` reports each token's
        log-probability and the ``k`` most likely alternatives."""
        ids = self._ids(prompt)
        kw = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, min_p=min_p,
                  top_k=top_k, stop=stop, seed=seed, repeat_penalty=repeat_penalty,
                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                  typical_p=typical_p, logit_bias=logit_bias, ignore_eos=ignore_eos)
        events = self._submit(ids, kw, n=n, logprobs=logprobs)
        name = model or self.name
        if stream:
            include_usage = bool((stream_options or {}).get("include_usage"))
            return _openai.completion_chunks(events, name, self._pieces, logprobs is not None,
                                             include_usage)
        echo_text = (prompt if isinstance(prompt, str) else self.detokenize(ids)) if echo else None
        return _openai.completion(events, n, name, self._pieces, logprobs is not None, echo_text)

    __call__ = create_completion

    def create_chat_completion(
        self,
        messages: Iterable[Message],
        *,
        max_tokens: Optional[int] = None,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        top_k: int = 40,
        stop: Optional[Union[str, List[str]]] = None,
        seed: Optional[int] = None,
        repeat_penalty: float = 1.0,
        presence_penalty: float = 0.0,
        frequency_penalty: float = 0.0,
        typical_p: float = 1.0,
        logit_bias: Optional[Mapping[int, float]] = None,
        ignore_eos: bool = False,
        logprobs: bool = False,
        top_logprobs: Optional[int] = None,
        n: int = 1,
        stream: bool = False,
        stream_options: Optional[Mapping[str, Any]] = None,
        response_format: Optional[Mapping[str, Any]] = None,
        tools: Optional[List[Any]] = None,
        tool_choice: Optional[Any] = None,
        parallel_tool_calls: Optional[bool] = None,
        grammar: Optional[str] = None,
        regex: Optional[str] = None,
        choice: Optional[Sequence[str]] = None,
        model: Optional[str] = None,
    ) -> Union[Dict[str, Any], Iterator[Dict[str, Any]]]:
        """A chat completion as the OpenAI API (and llama-cpp-python) returns it:
        ``{"id", "object": "chat.completion", "created", "model", "choices": [{"index",
        "message": {"role", "content"}, "logprobs", "finish_reason"}], "usage"}`` (usage
        includes ``prompt_tokens_details.cached_tokens``: prompt tokens served from the
        prefix cache). ``stream=True`` returns an iterator of ``chat.completion.chunk``
        dicts. ``max_tokens=None`` generates until the context is full.

        Structured output, as ``mica serve``: ``response_format`` ``{"type": "json_object"}``
        or ``{"type": "json_schema", "json_schema": {"schema": ...}}`` (enforced whether or
        not it says ``strict``), or mica's ``grammar`` (GBNF or Lark), ``regex`` (the whole
        output matches) or ``choice`` (exactly one of the strings) — at most one. Every
        token is constrained by grammar (llguidance), so the output always parses unless
        the length limit cuts it (``finish_reason`` ``"length"``); an invalid or unsupported
        schema raises ``InvalidParameter`` naming the argument before anything runs.

        Tools: ``tools`` (OpenAI's ``{"type": "function", "function": {"name",
        "description", "parameters"}}``; the ``openai`` SDK's types work too) reach the
        model through its chat template; ``tool_choice`` ``"auto"`` (default), ``"none"``,
        ``"required"`` or ``{"type": "function", "function": {"name": ...}}`` (the last two
        force valid calls by grammar: one, or several with ``parallel_tool_calls=True``).
        Calls whose arguments validate against their tool's schema come back as
        ``message.tool_calls`` (``finish_reason`` ``"tool_calls"``); messages may carry
        ``tool_calls`` (assistant) and ``tool_call_id`` (role ``tool``) for the results."""
        structured = self._structured(response_format, tools, tool_choice,
                                      parallel_tool_calls, grammar, regex, choice)
        ids = self._native.chat_prompt(_messages(messages), structured)
        kw = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, min_p=min_p,
                  top_k=top_k, stop=stop, seed=seed, repeat_penalty=repeat_penalty,
                  presence_penalty=presence_penalty, frequency_penalty=frequency_penalty,
                  typical_p=typical_p, logit_bias=logit_bias, ignore_eos=ignore_eos)
        k = (top_logprobs or 0) if logprobs else None
        events = self._submit(ids, kw, n=n, logprobs=k, structured=structured)
        name = model or self.name
        tool_set = structured if structured is not None and structured.has_tools else None
        if stream:
            include_usage = bool((stream_options or {}).get("include_usage"))
            return _openai.chat_chunks(events, n, name, self._pieces, logprobs, include_usage,
                                       tool_set)
        return _openai.chat_completion(events, n, name, self._pieces, logprobs, tool_set)

    # --- engine state ------------------------------------------------------------------

    def metrics(self) -> Dict[str, Any]:
        """The engine's gauges and counters: ``running``, ``waiting`` (queue depth),
        ``kv_blocks_used`` / ``_total`` / ``_cached``, token counts, ``requests`` by outcome
        (``ok``, ``cancelled``, ``error``, ``rejected``). ``started`` is False until the
        first generation starts the engine."""
        return self._native.metrics()

    def metrics_text(self) -> str:
        """The engine's metrics in Prometheus text format (as ``mica serve``'s
        ``/metrics``), labelled with this model's name."""
        return self._native.metrics_text(self.name)
