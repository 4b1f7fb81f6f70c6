"""HTTP calls to a running harvest worker or the PD router in front of it: /generate and admin reads."""

import asyncio
import time
from collections.abc import Callable

import httpx

from base.errors import HarvestError

# With the `fake` transfer backend a decode worker treats a request from this bootstrap host as already
# prefilled and runs the real decode loop on it (shared/STACK.md).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
STEPS_PAGE = 10_000


def generate_request(input_ids: list[int], max_new_tokens: int) -> dict:
    """A greedy /generate body with no transfer fields: a PD router fills in its prefill worker's bootstrap
    host, port and room (a real prefill and KV transfer); a worker on the `fake` backend decodes it as is."""
    return {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0},
    }


def prefilled_request(input_ids: list[int], max_new_tokens: int, room: int) -> dict:
    """A request a decode worker takes as prefilled whatever its transfer backend (no prefill worker needed).
    A PD router overwrites the bootstrap fields with its prefill worker's. (A `fake`-backend worker given no
    bootstrap host at all crashes in SGLang 0.5.12's pre-allocation, so the fake host is always sent.)"""
    return {**generate_request(input_ids, max_new_tokens), "bootstrap_host": FAKE_BOOTSTRAP_HOST,
            "bootstrap_room": room}


async def generate(client: httpx.AsyncClient, url: str, body: dict) -> dict:
    response = await client.post(f"{url}/generate", json=body)
    response.raise_for_status()
    return response.json()


async def generate_prefilled(client: httpx.AsyncClient, url: str, input_ids: list[int], max_new_tokens: int,
                             room: int) -> dict:
    return await generate(client, url, prefilled_request(input_ids, max_new_tokens, room))


def chat(url: str, question: str, max_tokens: int = 48, timeout_s: float = 300.0,
         lora_path: str | None = None) -> str:
    """One greedy chat completion (OpenAI route; the server applies the model's chat template). `lora_path`:
    the LoRA adapter to run it with (SGLang's own field), None for the base model."""
    body = {"model": "default", "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0.0, **({} if lora_path is None else {"lora_path": lora_path})}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout_s)
    response.raise_for_status()
    return response.json()["choices"][0]["message"]["content"].strip()


def read_last_step_seq(admin_url: str, timeout_s: float = 30.0) -> int:
    """Sequence number of the newest step record: pass it to read_steps_since to get the steps after it."""
    return read_stats(admin_url, timeout_s)["decode"]["decode_steps"]


def read_steps_since(admin_url: str, since: int, timeout_s: float = 30.0) -> list[dict]:
    """Every step record after sequence number `since`."""
    async def read() -> list[dict]:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            return (await read_steps_after(client, admin_url, since))[0]

    return asyncio.run(read())


async def read_steps_after(client: httpx.AsyncClient, admin_url: str, since: int) -> tuple[list[dict], int]:
    """Every step record after sequence number `since`, page by page, and the sequence number to go on from."""
    steps = []
    while True:
        response = await client.get(f"{admin_url}/harvest/steps", params={"since": since, "limit": STEPS_PAGE})
        response.raise_for_status()
        page = response.json()
        steps += page["steps"]
        since = page["next"]
        if len(page["steps"]) < STEPS_PAGE:
            return steps, since


def read_stats(admin_url: str, timeout_s: float = 10.0) -> dict:
    response = httpx.get(f"{admin_url}/harvest/stats", timeout=timeout_s)
    if response.is_error:
        raise HarvestError(f"{admin_url}/harvest/stats answered {response.status_code}: {response.text[:300]}")
    return response.json()



def wait_for_stats(admin_url: str, predicate: Callable[[dict], bool], what: str, timeout_s: float = 300.0) -> dict:
    """Poll /harvest/stats until `predicate` holds. Retried only while nothing answers in time (the worker is
    starting, or slow to answer while it builds its job): an error answer or a finetune job that failed meanwhile
    ends the wait at once."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            stats = read_stats(admin_url)
        except (httpx.ConnectError, httpx.TimeoutException):
            if time.monotonic() > deadline:
                raise HarvestError(f"nothing answered at {admin_url} for {timeout_s:.0f} s while waiting for {what}")
            time.sleep(0.5)
            continue
        if predicate(stats):
            return stats
        finetune = stats.get("finetune") or {}
        if finetune.get("state") == "failed":
            raise HarvestError(f"the finetune job failed while waiting for {what}: {finetune.get('error')}")
        if time.monotonic() > deadline:
            raise HarvestError(f"timed out after {timeout_s:.0f} s waiting for {what}: {stats}")
        time.sleep(0.5)
