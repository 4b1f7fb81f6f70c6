"""The Trainer's optimizer step, whole or cut into parts over its parameters, so a bounded job's optimizer
update is units like its layers' (a pause takes effect within one of them; HARLI sec. 6.1).

Cut as: one "grad_norm" unit (the global gradient norm every part clips by, as the HF Trainer's
clip_grad_norm_: get_total_norm, then clip_grads_with_norm_), then P optimizer units, each clipping and
stepping a 1/P share of every parameter group. For a per-parameter torch optimizer (Adam, AdamW, SGD, ...:
every torch.optim class but LBFGS) an update in parts is the same arithmetic as the whole one: each
parameter's update reads only its own gradient and state, the group's hyper-parameters and the LR, which the
scheduler moves only after the last part. Any other optimizer (bitsandbytes, a closure-driven one) is stepped
whole: its step may read across parameters.

Between two parts the adapter is part-updated: a checkpoint or a published adapter must wait for the last
part (FinetuneEngine.is_mid_update).
"""

import torch


def is_splittable(optimizer: torch.optim.Optimizer) -> bool:
    """Whether an update in parts equals the whole one (the module's docstring)."""
    return type(optimizer).__module__.startswith("torch.optim.") and not isinstance(optimizer, torch.optim.LBFGS)


class OptimizerParts:
    def __init__(self, optimizer: torch.optim.Optimizer, max_grad_norm: float | None) -> None:
        self.optimizer = optimizer
        self.max_grad_norm = max_grad_norm if max_grad_norm and max_grad_norm > 0 else None
        self.is_splittable = is_splittable(optimizer)
        self._grad_norm: torch.Tensor | None = None

    @property
    def is_clipping(self) -> bool:
        return self.max_grad_norm is not None

    @property
    def num_tensors(self) -> int:
        """Parameter tensors the optimizer steps: the most parts an update can be cut into."""
        return sum(len(group["params"]) for group in self.optimizer.param_groups)

    def throwaway_copy(self) -> "OptimizerParts | None":
        """The optimizer's class, groups and hyper-parameters over clones of its parameters with zero gradients:
        its updates run the job's kernels and leave the job's parameters, optimizer state and LR untouched.
        None for an optimizer other than torch's own (is_splittable): its constructor is not known."""
        if not self.is_splittable:
            return None
        groups = []
        for group in self.optimizer.param_groups:
            clones = []
            for param in group["params"]:
                clone = torch.nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
                clone.grad = torch.zeros_like(param)
                clones.append(clone)
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": clones})
        return OptimizerParts(type(self.optimizer)(groups), self.max_grad_norm)

    def take_grad_norm(self) -> None:
        """The "grad_norm" unit: the norm of all gradients, which each part clips by (kept on the device)."""
        grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
        self._grad_norm = torch.nn.utils.get_total_norm(grads)

    def step(self) -> float | None:
        """The whole update (clip, then step); returns the gradient norm (None without clipping)."""
        grad_norm = None
        if self.is_clipping:
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm))
        self.optimizer.step()
        return grad_norm

    def step_part(self, part: int, num_parts: int) -> float | None:
        """Part `part` of `num_parts` of an update whose grad_norm unit ran: clip and step the part's share of
        each group; returns the gradient norm on the last part (None otherwise, or without clipping)."""
        groups = self.optimizer.param_groups
        whole = [group["params"] for group in groups]
        shares = [params[part * len(params) // num_parts: (part + 1) * len(params) // num_parts] for params in whole]
        try:
            for group, share in zip(groups, shares):
                group["params"] = share
            if self.is_clipping:
                torch.nn.utils.clip_grads_with_norm_([p for share in shares for p in share], self.max_grad_norm,
                                                     self._grad_norm)
            self.optimizer.step()
        finally:
            for group, params in zip(groups, whole):
                group["params"] = params
        if part < num_parts - 1 or not self.is_clipping:
            return None
        grad_norm, self._grad_norm = float(self._grad_norm), None
        return grad_norm
