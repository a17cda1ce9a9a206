#!/usr/bin/env python3
"""Floods stdout and stderr with numbered lines, written in odd-sized chunks.

Line i of stream s for rank r is expected_line(r, s, i); every 97th line is
longer than 4096 bytes. Shared with test_output.py, which checks each line.
"""
import os
import random
import sys


def expected_line(rank, stream, i):
    if i % 97 == 0:
        body = ("%d-%s-" % (rank, stream)) * 1200 + "end"
    else:
        body = "x" * (i % 61)
    return "r%d %s %d %s" % (rank, stream, i, body)


def main():
    rank = int(os.environ["RANK"])
    n_out, n_err = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(rank)
    data = {1: "".join(expected_line(rank, "out", i) + "\n" for i in range(n_out)).encode(),
            2: "".join(expected_line(rank, "err", i) + "\n" for i in range(n_err)).encode()}
    pos = {1: 0, 2: 0}
    while any(pos[fd] < len(data[fd]) for fd in (1, 2)):
        fd = rng.choice([fd for fd in (1, 2) if pos[fd] < len(data[fd])])
        size = rng.choice([1, 7, 100, 4095, 4097, 9000, 65537])
        chunk = data[fd][pos[fd]:pos[fd] + size]
        written = os.write(fd, chunk)
        pos[fd] += written


if __name__ == "__main__":
    main()
