"""The adapter as one flat fp32 vector, and the token-weighted mean of the members' deltas.

A round sends one buffer: [tokens * delta, tokens]. Summed over the members it holds the weighted sum
and the total weight, so one all-reduce gives the weighted mean, and a member that trained 0 tokens
adds nothing to either (it does not pull the others back)."""

import torch


def flatten(params: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to("cpu", torch.float32) for p in params])


def assign(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Write the flat vector into the parameters (in place, their own dtype and device)."""
    offset = 0
    with torch.no_grad():
        for p in params:
            n = p.numel()
            p.copy_(flat[offset:offset + n].view_as(p))
            offset += n


def weighted_buffer(delta: torch.Tensor, tokens: int) -> torch.Tensor:
    return torch.cat([delta * float(tokens), torch.tensor([float(tokens)])])


def weighted_mean(summed: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(the mean delta, the round's total tokens) from the members' summed buffers; zero if none trained."""
    total = summed[-1].item()
    if total <= 0:
        return torch.zeros_like(summed[:-1]), 0
    return summed[:-1] / total, round(total)
