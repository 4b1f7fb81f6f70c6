"""An idle scheduler with no finetune unit to run waits for its next request off the interpreter lock.

SGLang's decode loop spins while idle unless `--sleep-on-idle` (which sleeps a second a turn: no finetune
unit would run while idle). A spinning scheduler thread holds the interpreter lock whenever it runs, so every
other thread of the process waits for it (up to the switch interval) after each system call or CUDA call that
let it go: the job's build thread (LlamaFactory's model loader imports every model configuration of
transformers), the admin server. A job started over a minute late so (eval/results/2026-11-27-h200-3/). A turn in
which no unit ran therefore waits on the sockets requests come in on (those of SGLang's IdleSleeper), for as
long as the runtime says the job lets it (HarvestRuntime.on_idle): a request wakes it at once.
"""

import zmq


class RequestWait:
    def __init__(self, scheduler):
        # Only the rank that reads the tokenizer's socket has one; the other ranks block in its broadcast.
        sockets = [getattr(scheduler, name, None) for name in ("recv_from_tokenizer", "recv_from_rpc")]
        sockets = [s for s in sockets if isinstance(s, zmq.Socket)]
        self._poller = zmq.Poller() if sockets else None
        for socket in sockets:
            self._poller.register(socket, zmq.POLLIN)

    def wait(self, timeout_ms: float) -> None:
        if self._poller is not None:
            self._poller.poll(timeout_ms)
