"""An idle scheduler with no finetune unit to run waits for its next request off the interpreter lock.

SGLang's decode loop spins while idle unless `--sleep-on-idle` (which sleeps a second a turn: no finetune
unit would run while idle). A spinning scheduler thread keeps the interpreter lock for five of every ten ms
and makes every other thread of the process wait for it after each system call: the job's build thread
(LlamaFactory's model loader imports every model configuration of transformers), the admin server. On an
H200 that made a job start 70-90 s after the worker served instead of seconds (eval/results/2026-11-27-h200-3/).
So a turn in which no unit ran waits on the sockets requests come in on (SGLang's IdleSleeper's), for at most
IDLE_WAIT_MS: a request wakes it at once, and a job that becomes ready (built, resumed) waits at most that.
"""

import zmq

IDLE_WAIT_MS = 20


class IdleWait:
    def __init__(self, scheduler):
        # Only the rank that reads the tokenizer's socket has one; the other ranks block in its broadcast.
        sockets = [s for s in (getattr(scheduler, "recv_from_tokenizer", None), getattr(scheduler, "recv_from_rpc", None))
                   if isinstance(s, zmq.Socket)]
        self._poller = zmq.Poller() if sockets else None
        for socket in sockets:
            self._poller.register(socket, zmq.POLLIN)

    def wait(self, timeout_ms: float = IDLE_WAIT_MS) -> None:
        if self._poller is not None:
            self._poller.poll(timeout_ms)
