"""What a worker asks a torchft lighthouse before it joins: that one answers at the URL, and that no live member
already has its replica id. The lighthouse's HTTP status page is the only view torchft gives of its members (its
quorum RPC would enrol the asker), so it is read here."""

import re

import httpx

from base.errors import HarvestError

HEARTBEAT = re.compile(r"([A-Za-z0-9_.-]+):[0-9a-f-]{36}: seen ([0-9.]+)(ns|µs|us|ms|s) ago")
SECONDS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
LIVE_WITHIN_S = 5.0
"""A member heard from this recently is live (torchft's default heartbeat timeout)."""


def live_replica_ids(status_html: str) -> set[str]:
    return {m.group(1) for m in HEARTBEAT.finditer(status_html)
            if float(m.group(2)) * SECONDS[m.group(3)] < LIVE_WITHIN_S}


def check_lighthouse(url: str, replica_id: str, timeout_s: float = 5.0) -> None:
    try:
        response = httpx.get(f"{url.rstrip('/')}/status", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise HarvestError(f"--fleet {url}: no torchft lighthouse answers there ({type(e).__name__}: {e})") from None
    if response.status_code != 200 or "quorum_id" not in response.text:
        raise HarvestError(f"--fleet {url}: it answers ({response.status_code}) but is no torchft lighthouse")
    if replica_id in live_replica_ids(response.text):
        raise HarvestError(f"--replica-id {replica_id}: a live member of the fleet at {url} already has it")
