"""The SGLang plugin: a control request type and its handler in every scheduler process.

* :class:`LeylineCtlReq` / :class:`LeylineCtlOut` — tagged msgspec structs on SGLang's IPC
  (``hook_custom_types`` at import, so every process that imports this module decodes them);
  ``body`` is JSON: ``{"op": ..., args}`` in, the :class:`~.splicer.SchedulerSplicer` reply out.
* :func:`register` — an AFTER hook on ``Scheduler.init_request_dispatcher`` that routes
  :class:`LeylineCtlReq` to the scheduler's splicer (built on first use). Every TP rank receives
  every control request in the same order and runs the same operation; only rank 0's reply is
  sent (SGLang's other ranks hold no socket). Usable as an ``sglang.srt.plugins`` entry point.
* :func:`run_scheduler_process` — what the engine launches instead of SGLang's own: it registers
  the hook in the (spawned) scheduler process, then runs SGLang's scheduler unchanged.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

from sglang.srt.managers.io_struct import BaseReq, hook_custom_types
from sglang.srt.plugins.hook_registry import HookRegistry, HookType

__all__ = ["LeylineCtlOut", "LeylineCtlReq", "register", "run_scheduler_process", "handle_request"]

logger = logging.getLogger("leyline.sglang")

DISPATCHER = "sglang.srt.managers.scheduler.Scheduler.init_request_dispatcher"


class LeylineCtlReq(BaseReq, kw_only=True):  # type: ignore[call-arg]
    """A Leyline control request: ``op`` and its JSON arguments."""

    op: str
    body: str = "{}"


class LeylineCtlOut(BaseReq, kw_only=True):  # type: ignore[call-arg]
    """The reply (JSON), carrying the request's ``rid``."""

    body: str = "{}"


hook_custom_types(LeylineCtlReq, LeylineCtlOut)

_registered = False


class _Refusing:
    """Stands in for the splicer when this scheduler's cache cannot be spliced at all."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "info":
            return {"ok": True, "refusals": [self.reason]}
        return {"ok": False, "code": "unsupported", "message": self.reason}


def _splicer(scheduler: Any) -> Any:
    splicer = getattr(scheduler, "_leyline_splicer", None)
    if splicer is None:
        from leyline_server.engines.sglang.splicer import SchedulerSplicer

        try:
            splicer = SchedulerSplicer.from_scheduler(scheduler)
        except Exception as exc:  # reported through "info": the engine refuses to start
            logger.exception("Leyline cannot splice this SGLang runtime")
            splicer = _Refusing(str(exc))
        scheduler._leyline_splicer = splicer
    return splicer


def handle_request(scheduler: Any, req: LeylineCtlReq) -> LeylineCtlOut:
    """Run one control request against ``scheduler``'s splicer (errors become error replies)."""
    try:
        reply = _splicer(scheduler).handle(req.op, json.loads(req.body))
    except Exception as exc:
        logger.exception("Leyline control request %s failed", req.op)
        reply = {"ok": False, "code": "internal", "message": f"{type(exc).__name__}: {exc}"}
    return LeylineCtlOut(rid=req.rid, body=json.dumps(reply))


def _after_init_request_dispatcher(result: Any, scheduler: Any, *args: Any, **kwargs: Any) -> None:
    from sglang.utils import TypeBasedDispatcher

    handler = functools.partial(handle_request, scheduler)
    scheduler._request_dispatcher += TypeBasedDispatcher([(LeylineCtlReq, handler)])


def register() -> None:
    """Hook the handler into SGLang's scheduler (idempotent; also the plugin entry point)."""
    global _registered
    if _registered:
        return
    _registered = True
    HookRegistry.register(DISPATCHER, _after_init_request_dispatcher, HookType.AFTER)


def run_scheduler_process(*args: Any, **kwargs: Any) -> Any:
    """SGLang's ``run_scheduler_process`` with the Leyline handler registered first (spawned per rank)."""
    from sglang.srt.managers.scheduler import run_scheduler_process as run

    register()
    HookRegistry.apply_hooks()
    return run(*args, **kwargs)
