"""AsyncLLM: the engine for asyncio servers (vLLM's AsyncLLM / AsyncLLMEngine).

One thread moves outputs from the native engine's queue to the asyncio queue
of the request they belong to; the engine steps on its own native thread, so
the event loop never waits for a forward pass."""

from __future__ import annotations

import asyncio
import itertools
import threading
import weakref
from typing import Any, AsyncGenerator, Optional

from . import _core
from ._checks import check_text
from ._engine import PromptType, Tokenizer, engine_json, make_engine, normalize_prompts, prompt_ids
from .outputs import RequestOutput, RequestState
from .sampling_params import RequestOutputKind, SamplingParams


class EngineArgs:
    """Engine arguments by vLLM's names, for from_engine_args()."""

    def __init__(self, model: Optional[str] = None, **kwargs: Any):
        self.model = model
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, {self.kwargs!r})"


class AsyncEngineArgs(EngineArgs):
    pass


class AsyncLLM:
    """`async for output in engine.generate(prompt, params, request_id)` streams
    RequestOutputs (cumulative by default; see SamplingParams.output_kind).
    Many concurrent requests share one engine's batches. Leaving the loop early
    (a client that disconnects, a cancelled task) aborts the request."""

    def __init__(self, model: Optional[str] = None, **engine_args: Any):
        self._engine = make_engine(model, engine_args)
        self._sink = _core.OutputQueue(self._engine)
        self._routes: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ids = itertools.count()
        self._tokenizer = Tokenizer(self._engine)
        self._pump = threading.Thread(target=_pump, args=(self._sink, self._routes, self._lock, self._stop),
                                      name="pagellm-outputs", daemon=True)
        self._pump.start()
        # Runs on shutdown(), when the object is collected, or at interpreter
        # exit, whichever comes first; it holds no reference to self.
        self._finalizer = weakref.finalize(self, _shutdown, self._engine, self._stop, self._pump)

    @classmethod
    def from_engine_args(cls, engine_args: EngineArgs) -> "AsyncLLM":
        return cls(engine_args.model, **engine_args.kwargs)

    async def generate(self, prompt: PromptType, sampling_params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None, *, priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        if self._stop.is_set():
            raise RuntimeError("the engine is shut down")
        sp = sampling_params or SamplingParams()
        item = normalize_prompts(prompt)
        if len(item) != 1:
            raise ValueError("AsyncLLM.generate takes one prompt")
        ids = prompt_ids(self._engine, item[0])
        rid = request_id if request_id is not None else f"async-{next(self._ids)}"
        if isinstance(rid, str):
            check_text(rid, "request_id")
        queue: asyncio.Queue = asyncio.Queue()
        with self._lock:
            if rid in self._routes:
                raise ValueError(f"duplicate request id '{rid}'")
            self._routes[rid] = (asyncio.get_running_loop(), queue)
        try:
            self._engine.submit([rid], [ids], [engine_json(sp, priority)], self._sink)
        except BaseException:
            with self._lock:
                self._routes.pop(rid, None)
            raise
        state = RequestState(rid, item[0].get("prompt"), ids, sp.n, sp.logprobs is not None,
                             sp.prompt_logprobs is not None)
        finished = False
        try:
            while not finished:
                out = await queue.get()
                state.add(out)
                finished = out["finished"]
                if finished and state.error:
                    raise RuntimeError(f"request {rid} failed: {state.error}")
                if sp.output_kind == RequestOutputKind.FINAL_ONLY and not finished:
                    continue
                yield state.output(delta=sp.output_kind == RequestOutputKind.DELTA)
        finally:
            if not finished:  # the caller left early: free the request's KV blocks now
                self._engine.abort(rid)
            # The id stays taken until its generator is done with it.
            with self._lock:
                self._routes.pop(rid, None)

    async def abort(self, request_id: str) -> None:
        """Stops a request; its generator ends with finish_reason "abort"."""
        if isinstance(request_id, str):
            check_text(request_id, "request_id")
        self._engine.abort(request_id)

    async def get_tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def get_metrics(self) -> dict[str, Any]:
        import json
        return json.loads(self._engine.stats_json())

    @property
    def is_running(self) -> bool:
        return not self._stop.is_set()

    @property
    def errored(self) -> bool:
        return False

    def shutdown(self) -> None:
        """Aborts what is running and stops the engine. Idempotent."""
        self._finalizer()


AsyncLLMEngine = AsyncLLM


def _pump(sink, routes, lock, stop) -> None:
    while not stop.is_set():
        out = sink.next(0.1)
        if out is None:
            continue
        with lock:
            route = routes.get(out["request_id"])
        if route is None:
            continue
        loop, queue = route
        try:
            loop.call_soon_threadsafe(queue.put_nowait, out)
        except RuntimeError:  # the request's event loop is closed
            pass


def _shutdown(engine, stop, pump) -> None:
    engine.shutdown(0.0)
    stop.set()
    pump.join()
