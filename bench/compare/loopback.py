"""The machine's loopback ceiling: how fast can two processes move bytes over TCP on 127.0.0.1?

Two measurements, each between two processes:
  one-way  one process sends, the other receives (one stream);
  duplex   each process sends to and receives from the other at the same time, as a
           2-rank ring all-reduce does; reported per direction.
An all-reduce's busbw (bytes each rank sends per second) cannot beat the duplex figure.

Usage: loopback.py [--mb 256] [--repeats 3]   prints one JSON object.
"""

import argparse
import json
import multiprocessing as mp
import socket
import threading
import time

CHUNK = 4 << 20


def _send_all(sock, total):
    buf = memoryview(bytearray(CHUNK))
    left = total
    while left:
        n = min(left, CHUNK)
        sock.sendall(buf[:n])
        left -= n


def _recv_all(sock, total):
    buf = memoryview(bytearray(CHUNK))
    left = total
    while left:
        n = sock.recv_into(buf, min(left, CHUNK))
        if n == 0:
            raise RuntimeError(f"loopback peer closed with {left} bytes outstanding")
        left -= n


def _tune(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _peer(port, total, duplex, ready):
    sock = socket.create_connection(("127.0.0.1", port))
    _tune(sock)
    ready.wait()
    if duplex:
        t = threading.Thread(target=_send_all, args=(sock, total))
        t.start()
        _recv_all(sock, total)
        t.join()
    else:
        _recv_all(sock, total)
    sock.sendall(b"k")  # tell the sender everything arrived
    sock.close()


def measure(total, duplex):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    ready = mp.Event()
    proc = mp.Process(target=_peer, args=(port, total, duplex, ready))
    proc.start()
    conn, _ = srv.accept()
    _tune(conn)
    ready.set()
    start = time.perf_counter()
    if duplex:
        t = threading.Thread(target=_recv_all, args=(conn, total))
        t.start()
        _send_all(conn, total)
        t.join()
    else:
        _send_all(conn, total)
    ack = conn.recv(1)
    elapsed = time.perf_counter() - start
    if ack != b"k":
        raise RuntimeError("loopback peer did not acknowledge")
    proc.join()
    conn.close()
    srv.close()
    return total / elapsed / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="bytes per direction per repeat, MiB")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    total = args.mb << 20
    measure(16 << 20, False)  # warm-up
    one_way = sorted(measure(total, False) for _ in range(args.repeats))
    duplex = sorted(measure(total, True) for _ in range(args.repeats))
    print(json.dumps({
        "one_way_GBps": one_way[len(one_way) // 2],
        "duplex_per_direction_GBps": duplex[len(duplex) // 2],
        "bytes_per_repeat": total,
        "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
