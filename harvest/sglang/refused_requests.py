"""harvest in SGLang's HTTP process: a request refused for its adapter leaves nothing in flight.

SGLang 0.5.12's TokenizerManager.generate_request records a request as in flight (`rid_to_state`,
`_init_req_state`) before it checks the request's `lora_path` (`_validate_and_resolve_lora`). When that
check refuses the request (an adapter never loaded, or one in the gap of a publish's unload then load:
adapter_publisher.py) the client gets its 400 but the record stays, and SGLang's graceful shutdown
(`sigterm_watchdog`) waits for that request forever, until the supervisor kills the worker. The request
never reached the scheduler, so forgetting it is all SGLang's own cleanup would have done.

Deferred imports: SGLang is imported when a hook is installed or fires, inside the worker that runs it; importing it
sets up its CUDA and multiprocessing state.
"""

TOKENIZER_MANAGER = "sglang.srt.managers.tokenizer_manager.TokenizerManager"


async def forget_refused_request(validate, manager, obj, *args, **kwargs):
    try:
        return await validate(manager, obj, *args, **kwargs)
    except Exception:
        for rid in [obj.rid] if isinstance(obj.rid, str) else obj.rid:
            manager.rid_to_state.pop(rid, None)
        raise


def install_refused_request_hook() -> None:
    """In the process that serves SGLang's HTTP API, before it starts."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{TOKENIZER_MANAGER}._validate_and_resolve_lora", forget_refused_request,
                          HookType.AROUND)
    HookRegistry.apply_hooks()
