"""A LoRA name loaded again from tensors replaces its adapter atomically for requests, in harvest's workers.

SGLang 0.5.12 refuses to load a name it has, and its unload-then-load leaves a gap in which a request
naming the adapter gets a 400. Its registry (sglang/srt/lora/lora_registry.py) lives in the HTTP
process's tokenizer manager: each request looks its name up there, under the registry's lock, and runs on
that lora_id to its end (the registry counts it). So harvest hooks `load_lora_adapter_from_tensors` in the
HTTP process: a name already loaded is loaded again under a versioned internal name, then, under the
registry's lock, the name is pointed at the new lora_id in one step; the old version is unloaded once its
requests ended (SGLang's own wait_for_unload and unload, as its unload route does). A request runs on the
version its name pointed to when the tokenizer manager received it.

Deferred imports: SGLang is imported when a hook is installed or fires, inside the worker that runs it; importing it
sets up its CUDA and multiprocessing state.
"""

import logging
import uuid

TOKENIZER = "sglang.srt.managers.tokenizer_control_mixin.TokenizerControlMixin"

logger = logging.getLogger(__name__)


def install_atomic_replace() -> None:
    """Call in the process that runs SGLang's HTTP server, before launch_server."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{TOKENIZER}.load_lora_adapter_from_tensors", around_load_from_tensors, HookType.AROUND)
    HookRegistry.apply_hooks()


async def around_load_from_tensors(load, tokenizer_manager, obj, *args, **kwargs):
    registry = getattr(tokenizer_manager, "lora_registry", None)
    old = None if registry is None else registry.get_all_adapters().get(obj.lora_name)
    if old is None:
        return await load(tokenizer_manager, obj, *args, **kwargs)
    name = obj.lora_name
    obj.lora_name = f"{name}@{uuid.uuid4().hex[:12]}"  # the new version, until the name points at it
    result = await load(tokenizer_manager, obj, *args, **kwargs)
    if not result.success:
        return result
    from sglang.srt.lora.lora_registry import LoRARef
    from sglang.srt.managers.io_struct import UnloadLoRAAdapterReqInput

    async with tokenizer_manager.lora_update_lock:
        async with registry._registry_lock.writer_lock:
            new = registry._registry.pop(obj.lora_name)
            registry._registry[name] = LoRARef(lora_id=new.lora_id, lora_name=name, lora_path=new.lora_path,
                                               pinned=new.pinned)
        tokenizer_manager.lora_ref_cache.pop(obj.lora_name, None)
        tokenizer_manager.lora_ref_cache[name] = registry._registry[name]
        # As SGLang's unload: no new request gets the old lora_id; the scheduler frees it after its requests.
        await registry.wait_for_unload(old.lora_id)
        unloaded = (await tokenizer_manager.update_lora_adapter_communicator(
            UnloadLoRAAdapterReqInput(lora_name=old.lora_name, lora_id=old.lora_id)))[0]
    if not unloaded.success:
        logger.error("harvest: the replaced version of LoRA %s was not unloaded: %s", name, unloaded.error_message)
    # What the route answers: the names requests can give, as SGLang's own load answers.
    result.loaded_adapters = {n: ref.lora_path for n, ref in registry.get_all_adapters().items()}
    return result
