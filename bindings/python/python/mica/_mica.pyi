"""Type stubs of the native module ``mica._mica`` (see ``mica`` for the public API)."""

from __future__ import annotations

import os
import pathlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import numpy.typing as npt

__version__: str

Path = Union[str, "os.PathLike[str]"]
Progress = Callable[[Dict[str, Any]], None]

# ("token", index, token_id, text, None | (logprob, [(token_id, logprob), ...]))
# ("done", index, finish_reason, text)
# ("finished", prompt_tokens, cached_tokens, completion_tokens)
Event = Tuple[Any, ...]

class EventStream(Iterator[Event]):
    def __iter__(self) -> EventStream: ...
    def __next__(self) -> Event: ...
    def close(self) -> None: ...
    @property
    def running(self) -> bool: ...

class NativeModel:
    def __init__(
        self,
        path: Path,
        *,
        n_ctx: Optional[int] = None,
        n_threads: Optional[int] = None,
        kv_mem: Optional[int] = None,
        max_waiting: Optional[int] = None,
        prefix_caching: bool = True,
        repack: bool = True,
        lora: Sequence[Tuple[Path, float]] = (),
        cache_type_k: Optional[str] = None,
        cache_type_v: Optional[str] = None,
    ) -> None: ...
    @property
    def path(self) -> pathlib.Path: ...
    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def n_ctx_train(self) -> int: ...
    @property
    def architecture(self) -> str: ...
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> List[int]: ...
    def detokenize(self, ids: Sequence[int]) -> str: ...
    def token_piece(self, id: int) -> Optional[bytes]: ...
    def structured(
        self,
        constraint: Optional[Tuple[str, str]] = None,
        tools: Optional[str] = None,
        tool_choice: Optional[str] = None,
        parallel_tool_calls: bool = False,
    ) -> NativeStructured: ...
    def chat_prompt(
        self, messages: str, structured: Optional[NativeStructured] = None
    ) -> List[int]: ...
    def logits(self, ids: Sequence[int], all: bool = False) -> npt.NDArray[np.float32]: ...
    def embed(self, texts: Sequence[str], normalize: bool = True) -> npt.NDArray[np.float32]: ...
    def submit(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: Optional[int] = None,
        temperature: Optional[float] = None,
        top_k: Optional[int] = None,
        top_p: Optional[float] = None,
        min_p: Optional[float] = None,
        repeat_penalty: Optional[float] = None,
        presence_penalty: Optional[float] = None,
        frequency_penalty: Optional[float] = None,
        penalty_last_n: Optional[int] = None,
        seed: Optional[int] = None,
        stop: Sequence[str] = ...,
        ignore_eos: bool = False,
        logit_bias: Sequence[Tuple[int, float]] = ...,
        n: int = 1,
        logprobs: Optional[int] = None,
        lane: Optional[str] = None,
        typical_p: Optional[float] = None,
        xtc_probability: Optional[float] = None,
        xtc_threshold: Optional[float] = None,
        dry_multiplier: Optional[float] = None,
        dry_base: Optional[float] = None,
        dry_allowed_length: Optional[int] = None,
        dry_penalty_last_n: Optional[int] = None,
        dry_sequence_breakers: Optional[Sequence[str]] = None,
        structured: Optional[NativeStructured] = None,
    ) -> EventStream: ...
    def metrics(self) -> Dict[str, Any]: ...
    def metrics_text(self, name: str) -> str: ...

# (name, arguments as a JSON string)
Call = Tuple[str, str]

class NativeStructured:
    @property
    def has_tools(self) -> bool: ...
    def parse(self, text: str) -> Tuple[str, List[Call]]: ...
    def stream(self) -> NativeToolStream: ...

class NativeToolStream:
    def push(self, text: str) -> str: ...
    def finish(self) -> Tuple[str, List[Call]]: ...

class NativeServer:
    def __init__(
        self,
        models: Sequence[Tuple[str, Path]],
        *,
        host: str = "127.0.0.1",
        port: int = 8080,
        n_threads: Optional[int] = None,
        n_ctx: Optional[int] = None,
        kv_mem: int = ...,
        api_keys: Sequence[str] = ...,
        open_routes: Sequence[str] = ...,
        max_loaded: int = 1,
        queue_limit: int = 256,
        preload: Optional[str] = None,
        shutdown_grace: float = 30.0,
    ) -> None: ...
    def start(self) -> int: ...
    def stop(self) -> None: ...
    @property
    def port(self) -> Optional[int]: ...
    @property
    def ready(self) -> bool: ...

def resolve(name_or_path: Optional[str] = None, *, models_dir: Optional[Path] = None,
            progress: Optional[Progress] = None) -> pathlib.Path: ...
def pull(name: str, *, models_dir: Optional[Path] = None,
         progress: Optional[Progress] = None) -> pathlib.Path: ...
def list_models(
    *, models_dir: Optional[Path] = None
) -> List[Tuple[str, pathlib.Path, str, int]]: ...
def store_dir(models_dir: Optional[Path] = None) -> pathlib.Path: ...
def discover(dir: Path) -> List[Tuple[str, pathlib.Path]]: ...
def convert(
    src: Path,
    dst: Path,
    *,
    type: Optional[str] = None,
    mix: Optional[float] = None,
    tensor_types: Sequence[str] = ...,
    imatrix: Optional[Path] = None,
    calibrate: Optional[Path] = None,
    calibrate_ctx: int = 512,
    calibrate_chunks: Optional[int] = None,
    gptq: bool = False,
    threads: Optional[int] = None,
    progress: Optional[Progress] = None,
    lora: Sequence[Tuple[Path, float]] = (),
) -> Dict[str, Any]: ...
