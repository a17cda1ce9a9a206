"""The machine's loopback ceiling: how fast can two processes exchange bytes over TCP on
127.0.0.1?

For each size S, both processes send messages of S bytes to each other at the same time
(a sender and a receiver thread each, one system call per message, 64 MiB per direction
per measurement), as a 2-rank ring all-reduce does: each rank sends S bytes in all (S/2
in reduce-scatter, S/2 in all-gather) while receiving as much. The figure is bytes per
direction per second, median of repeats: the busbw an all-reduce of S bytes would reach
if moving bytes were all it did. Also a one-way stream for reference.

Usage: loopback.py [--sizes 1048576,16777216] [--repeats 5]   prints one JSON object.
"""

import argparse
import json
import multiprocessing as mp
import socket
import statistics
import threading
import time

def _recv_exact(sock, view):
    # MSG_WAITALL: one system call, with the GIL released, for the whole message.
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got, socket.MSG_WAITALL)
        if n == 0:
            raise RuntimeError("loopback peer closed with %d bytes outstanding"
                               % (len(view) - got))
        got += n


def _block(sock, sbuf, rbuf, kind, size, repeats):
    """One size: handshake, then `repeats` messages (each way for duplex). Returns the time
    from the handshake to the last byte received (duplex) or acknowledged (one way)."""
    sock.sendall(b"s")
    _recv_exact(sock, memoryview(bytearray(1)))
    start = time.perf_counter()
    send, recv = memoryview(sbuf)[:size], memoryview(rbuf)[:size]
    if kind == "duplex":
        t = threading.Thread(target=lambda: [_recv_exact(sock, recv) for _ in range(repeats)])
        t.start()
        for _ in range(repeats):
            sock.sendall(send)
        t.join()
    elif kind == "send":
        for _ in range(repeats):
            sock.sendall(send)
        _recv_exact(sock, memoryview(bytearray(1)))
    else:  # receive
        for _ in range(repeats):
            _recv_exact(sock, recv)
        sock.sendall(b"k")
    return time.perf_counter() - start


def _connect(port):
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _buffers(plan):
    biggest = max(size for _, size, _ in plan)
    return bytearray(biggest), bytearray(biggest)


def _peer(port, plan):
    sock = _connect(port)
    sbuf, rbuf = _buffers(plan)
    for kind, size, repeats in plan:
        _block(sock, sbuf, rbuf, "receive" if kind == "send" else kind, size, repeats)
    sock.close()


def run(plan):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    proc = mp.Process(target=_peer, args=(srv.getsockname()[1], plan))
    proc.start()
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sbuf, rbuf = _buffers(plan)
    results = []
    for kind, size, repeats in plan:
        seconds = _block(conn, sbuf, rbuf, kind, size, repeats)
        results.append((kind, size, size * repeats / seconds / 1e9))
    proc.join()
    conn.close()
    srv.close()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(str(1 << k) for k in (20, 22, 24, 26)),
                    help="comma-separated exchange sizes in bytes")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    plan = [("duplex", 1 << 20, 3)]  # warm-up
    for _ in range(args.repeats):
        plan += [("duplex", s, max(1, (64 << 20) // s)) for s in sizes]
        plan += [("send", 64 << 20, 2)]
    results = run(plan)[1:]
    duplex = {str(s): statistics.median(bw for kind, size, bw in results
                                        if kind == "duplex" and size == s) for s in sizes}
    print(json.dumps({
        "duplex_GBps": duplex,
        "duplex_per_direction_GBps": max(duplex.values()),
        "one_way_GBps": statistics.median(bw for kind, _, bw in results if kind == "send"),
        "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
