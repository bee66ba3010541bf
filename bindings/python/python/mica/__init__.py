"""mica: local LLM inference on the CPU, from Python.

>>> import mica
>>> model = mica.Model("smollm2-135m-instruct")          # doctest: +SKIP
>>> model.chat("What is the capital of France?", temperature=0)   # doctest: +SKIP

- :class:`Model` opens a model (a file, a folder, or a name in the store) and generates
  (``generate``, ``stream``, ``chat``), answers in OpenAI's shapes
  (``create_completion``, ``create_chat_completion``), tokenizes, and returns raw logits
  as numpy arrays. One model serves many Python threads at once: its engine batches them.
- :func:`pull` fetches a model into the store; :func:`list_models` lists the store.
- :func:`convert` converts and quantizes (GGUF, ``.mica``, Hugging Face folders).
- :class:`Server` runs the OpenAI-, Anthropic- and Ollama-compatible HTTP server in the
  background.

Errors are :class:`MicaError` subclasses (``mica.InvalidParameter`` is also a
``ValueError``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Union

from . import _mica
from ._errors import (
    ChatTemplateError,
    ConvertError,
    EngineError,
    EngineStopped,
    HubError,
    InvalidParameter,
    MicaError,
    ModelError,
    ModelNotFound,
    PromptTooLong,
    QueueFull,
    ServerError,
    TokenizerError,
)
from ._model import Model
from ._server import Server

__version__: str = _mica.__version__

PathLike = Union[str, "os.PathLike[str]"]


def pull(
    name: str,
    *,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    models_dir: Optional[PathLike] = None,
) -> str:
    """Fetches a catalog model (``mica list --catalog``) or ``hf:ORG/REPO[:FILE]`` into the
    store, resumably and checked against its sha256; returns its path. A model already
    there is not fetched again.

    ``progress`` is called with dicts: ``{"type": "status", "message"}``, and for each
    transfer ``{"type": "start" | "advance" | "finish", "phase", "done", "total"}`` (bytes;
    ``total`` may be ``None``)."""
    return str(_mica.pull(name, models_dir=models_dir, progress=progress))


def list_models(*, models_dir: Optional[PathLike] = None) -> List[Dict[str, Any]]:
    """The models in the store: ``{"name", "path", "kind", "bytes"}`` each."""
    return [
        {"name": n, "path": str(p), "kind": k, "bytes": b}
        for n, p, k, b in _mica.list_models(models_dir=models_dir)
    ]


def convert(
    src: PathLike,
    dst: PathLike,
    *,
    type: Optional[str] = None,
    mix: Optional[float] = None,
    tensor_types: Iterable[str] = (),
    imatrix: Optional[PathLike] = None,
    calibrate: Optional[PathLike] = None,
    calibrate_ctx: int = 512,
    calibrate_chunks: Optional[int] = None,
    gptq: bool = False,
    threads: Optional[int] = None,
    progress: Optional[Callable[[Dict[str, Any]], None]] = None,
    lora: Iterable[Union[PathLike, Tuple[PathLike, float]]] = (),
) -> Dict[str, Any]:
    """Converts a GGUF file, ``.mica`` file or Hugging Face folder into GGUF or ``.mica``
    (by ``dst``'s extension), as ``mica convert`` does: ``type`` quantizes with llama.cpp's
    per-tensor rules (``"q4_k"``, ``"q8_0"``, ...), ``mix`` picks a type per tensor for an
    average bits per weight, ``tensor_types`` are ``"REGEX=TYPE"`` overrides, ``imatrix`` /
    ``calibrate`` weigh the quantization error (``gptq`` compensates it), ``lora`` merges
    adapters (paths or ``(path, scale)`` pairs) before quantizing. Returns the
    report (``tensors``, ``converted``, ``bytes_written``, ``bits_per_weight``,
    ``notices``, ...). ``progress`` receives ``{"type": "start", "task", "total"}``,
    ``{"type": "item", "name"}``, ``{"type": "advance", "n"}``, ``{"type": "finish"}`` and
    ``{"type": "notice", "message", "warning"}``."""
    return _mica.convert(
        os.fspath(src),
        os.fspath(dst),
        type=type,
        mix=mix,
        tensor_types=list(tensor_types),
        imatrix=None if imatrix is None else os.fspath(imatrix),
        calibrate=None if calibrate is None else os.fspath(calibrate),
        calibrate_ctx=calibrate_ctx,
        calibrate_chunks=calibrate_chunks,
        gptq=gptq,
        threads=threads,
        progress=progress,
        lora=[(os.fspath(a[0]), float(a[1])) if isinstance(a, tuple) else (os.fspath(a), 1.0)
              for a in lora],
    )


def store_dir() -> str:
    """The model store's directory: ``$MICA_HOME/models``, else
    ``<user cache dir>/mica/models``."""
    return str(_mica.store_dir())


__all__ = [
    "Model",
    "Server",
    "pull",
    "list_models",
    "convert",
    "store_dir",
    "MicaError",
    "ModelError",
    "ModelNotFound",
    "TokenizerError",
    "ChatTemplateError",
    "InvalidParameter",
    "PromptTooLong",
    "QueueFull",
    "EngineError",
    "EngineStopped",
    "HubError",
    "ConvertError",
    "ServerError",
    "__version__",
]
