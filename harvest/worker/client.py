"""HTTP calls to a running harvest worker: pre-filled decode requests and admin reads."""

import asyncio

import httpx

# With the `fake` transfer backend a decode worker treats a request from this bootstrap host as already
# prefilled and runs the real decode loop on it (shared/STACK.md).
FAKE_BOOTSTRAP_HOST = "2.2.2.2"
STEPS_PAGE = 10_000


def prefilled_request(input_ids: list[int], max_new_tokens: int, room: int) -> dict:
    return {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0.0},
        "bootstrap_host": FAKE_BOOTSTRAP_HOST,
        "bootstrap_room": room,
    }


async def generate_prefilled(client: httpx.AsyncClient, url: str, input_ids: list[int], max_new_tokens: int,
                             room: int) -> dict:
    response = await client.post(f"{url}/generate", json=prefilled_request(input_ids, max_new_tokens, room))
    response.raise_for_status()
    return response.json()


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
    response.raise_for_status()
    return response.json()

