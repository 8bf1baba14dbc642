"""A process that streams writes into a store and prints each one once it is acknowledged.

Used by test_store_crash.py, which kills it with SIGKILL mid-stream. Each line on stdout is
`ack <call seq> <k>`: call number k (whose arrays are derived from k) was committed.
"""

import sys
import threading
from array import array

from agl.store import Store
from agl.types import Call, Status


def payload(k: int) -> tuple[array, array, array]:
    n = 64 + k % 512
    return (
        array("i", [(k * 31 + i) % 50_000 for i in range(4 * n)]),
        array("i", [(k + i) % 50_000 for i in range(n)]),
        array("f", [-((k + i) % 97) / 10 for i in range(n)]),
    )


def main(url: str, threads: int) -> None:
    store = Store(url)
    rid = store.create_rollout({"crash": True}, "crash").result().rollout.id
    store.transition(rid, Status.RUNNING).result()
    lock = threading.Lock()
    counter = iter(range(10**9))

    def writer() -> None:
        while True:
            with lock:
                k = next(counter)
            call = store.append_call(Call(rid, *payload(k))).result()
            with lock:
                sys.stdout.write(f"ack {call.seq} {k}\n")
                sys.stdout.flush()

    for _ in range(threads):
        threading.Thread(target=writer, daemon=True).start()
    threading.Event().wait()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
