"""``mica.Server``: ``mica serve`` (the OpenAI-, Anthropic- and Ollama-compatible HTTP server)
started and stopped from Python, for tests, notebooks and Ray replicas."""

from __future__ import annotations

import os
from typing import Any, Iterable, List, Mapping, Optional, Tuple, Union

from . import _mica
from ._errors import ServerError

PathLike = Union[str, "os.PathLike[str]"]


class Server:
    """An HTTP server in a background thread of this process.

    The models it offers come from ``models`` (names or paths as ``mica.Model`` takes them,
    or a ``{api_name: name_or_path}`` mapping), else from ``models_dir`` (every ``.gguf``,
    ``.mica`` and Hugging Face folder in it, named by file stem), else from the model store.
    ``port=0`` picks a free port; ``start()`` returns once the server listens and, with
    ``preload`` (``True``: the first model, or a model's API name), once that model is
    loaded. ``api_keys`` require ``Authorization: Bearer KEY`` on every route but
    ``/health`` and the ``open_routes`` (e.g. ``["/ready", "/metrics"]``). ``stop()`` is
    ``mica serve``'s graceful shutdown: new requests get 503 and those in flight may run
    on for ``shutdown_grace`` seconds. Use it as a context manager or call ``stop()``.

    >>> with mica.Server(models=["smollm2-135m-instruct"], port=0) as srv:  # doctest: +SKIP
    ...     client = openai.OpenAI(base_url=srv.base_url, api_key="none")
    """

    def __init__(
        self,
        models_dir: Optional[PathLike] = None,
        *,
        models: Optional[Union[Iterable[PathLike], Mapping[str, PathLike]]] = None,
        host: str = "127.0.0.1",
        port: int = 8080,
        n_threads: Optional[int] = None,
        n_ctx: Optional[int] = None,
        kv_mem: int = 512 << 20,
        api_keys: Iterable[str] = (),
        open_routes: Iterable[str] = (),
        max_loaded: int = 1,
        queue_limit: int = 256,
        preload: Union[bool, str] = False,
        shutdown_grace: float = 30.0,
    ) -> None:
        pairs = self._models(models_dir, models)
        if preload is True:
            name: Optional[str] = pairs[0][0]
        elif preload is False:
            name = None
        else:
            name = str(preload)
        self.host = host
        self.models: List[Tuple[str, str]] = [(n, str(p)) for n, p in pairs]
        self._native = _mica.NativeServer(
            self.models,
            host=host,
            port=port,
            n_threads=n_threads,
            n_ctx=n_ctx,
            kv_mem=kv_mem,
            api_keys=list(api_keys),
            open_routes=list(open_routes),
            max_loaded=max_loaded,
            queue_limit=queue_limit,
            preload=name,
            shutdown_grace=shutdown_grace,
        )

    @staticmethod
    def _models(models_dir: Optional[PathLike], models: Any) -> List[Tuple[str, Any]]:
        from ._model import _model_name

        if models is not None:
            if isinstance(models, Mapping):
                items = [(str(k), os.fspath(v)) for k, v in models.items()]
            else:
                items = []
                for m in models:
                    path = str(_mica.resolve(os.fspath(m)))
                    items.append((_model_name(path), path))
            return [(name, str(_mica.resolve(p))) for name, p in items]
        directory = os.fspath(models_dir) if models_dir is not None else str(_mica.store_dir())
        found = _mica.discover(directory)
        if not found:
            raise ServerError(f"no models in {directory}")
        return found

    def start(self) -> "Server":
        """Starts serving; returns ``self`` (``port`` is then the port bound)."""
        self._native.start()
        return self

    def stop(self) -> None:
        """Stops taking requests, lets those in flight end (within ``shutdown_grace``), and
        joins the server's thread."""
        self._native.stop()

    @property
    def ready(self) -> bool:
        """What ``/ready`` answers: running, the preload model loaded, not draining."""
        return self._native.ready

    @property
    def port(self) -> Optional[int]:
        """The port bound while running."""
        return self._native.port

    @property
    def url(self) -> str:
        """``http://host:port`` of the running server."""
        if self.port is None:
            raise ServerError("the server is not running")
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI API base (``…/v1``), for ``openai.OpenAI(base_url=...)``."""
        return self.url + "/v1"

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
