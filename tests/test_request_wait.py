"""The idle scheduler's wait (harvest/sglang/request_wait.py) on real zmq sockets: a request already sent or sent
during the wait ends it at once; with none it lasts its timeout; a rank with no request socket does not wait."""

import threading
import time
from types import SimpleNamespace

import zmq

from harvest.sglang.request_wait import RequestWait


def socket_pair(context):
    pull = context.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push = context.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{port}")
    return pull, push


def timed_wait(request_wait, timeout_ms):
    started = time.monotonic()
    request_wait.wait(timeout_ms)
    return time.monotonic() - started


def test_a_request_ends_the_wait_and_none_lets_it_run_its_timeout():
    context = zmq.Context()
    pull, push = socket_pair(context)
    try:
        request_wait = RequestWait(SimpleNamespace(recv_from_tokenizer=pull, recv_from_rpc=None))
        assert timed_wait(request_wait, 50) >= 0.045  # nothing came: the whole timeout
        push.send(b"request")
        assert timed_wait(request_wait, 10_000) < 5.0  # already waiting to be read: at once
        pull.recv()
        threading.Timer(0.2, push.send, args=(b"request",)).start()
        assert timed_wait(request_wait, 10_000) < 5.0  # arrives during the wait: woken by it
    finally:
        pull.close(linger=0), push.close(linger=0), context.term()


def test_a_rank_without_request_sockets_does_not_wait():
    request_wait = RequestWait(SimpleNamespace(recv_from_tokenizer=None, recv_from_rpc=None))
    assert timed_wait(request_wait, 10_000) < 5.0
