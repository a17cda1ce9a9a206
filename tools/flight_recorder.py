#!/usr/bin/env python3
"""Lines up the flight recorder files of all ranks and points at the first collective
that not every rank entered (or that ranks entered with different calls).

    python3 tools/flight_recorder.py DIR           # DIR holds flight_recorder.rank<r>.json
    python3 tools/flight_recorder.py FILE [FILE...]

Each file is what one rank's process group recorded (see docs/debugging.md): its last
collectives with sequence number, call, wall-clock start and end, and state. Exit code:
0 when every rank entered and completed the same collectives, 1 when a problem was found,
2 on bad input.
"""

import argparse
import glob
import json
import os
import sys


def load(paths):
    ranks = {}
    world = None
    for path in paths:
        with open(path) as f:
            text = f.read()
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ValueError(
                "%s is not a complete flight-recorder dump (%d bytes; %s): it was cut short, "
                "most likely because its process died while writing it. Pass the other ranks' "
                "files by name to analyse them without it" % (path, len(text), e)) from None
        try:
            r = int(doc["rank"])
            world = int(doc["world_size"]) if world is None else world
            ranks[r] = {
                "reason": doc.get("reason", ""),
                "entries": {int(e["seq"]): e for e in doc.get("entries", [])},
            }
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError("%s is JSON but not a flight-recorder dump: expected 'rank', "
                             "'world_size' and 'entries' with a 'seq' each (%s: %s)"
                             % (path, type(e).__name__, e)) from None
    return world, ranks


def first_seq(rank):
    return min(rank["entries"]) if rank["entries"] else None


def last_seq(rank):
    return max(rank["entries"]) if rank["entries"] else 0


def describe(e):
    return "#%d %s (%s)" % (e["seq"], e["what"], e["state"])


def analyse(world, ranks):
    """Returns (lines, problem_found)."""
    out = []
    missing = [r for r in range(world) if r not in ranks]
    for r in sorted(ranks):
        out.append("rank %d: %d record(s), last #%d; written because: %s"
                   % (r, len(ranks[r]["entries"]), last_seq(ranks[r]), ranks[r]["reason"]))
    if missing:
        out.append("rank(s) %s wrote no record (killed, or stuck outside collectives)"
                   % ", ".join(map(str, missing)))
    if not ranks:
        return out, True
    top = max(last_seq(v) for v in ranks.values())
    # Every rank's ring covers sequence numbers from its first record on.
    start = max((first_seq(v) or 1) for v in ranks.values())
    for seq in range(start, top + 1):
        present = {r: v["entries"].get(seq) for r, v in ranks.items()}
        absent = sorted(r for r, e in present.items() if e is None)
        entered = sorted(r for r, e in present.items() if e is not None)
        if absent:
            e = present[entered[0]]
            out.append("")
            out.append("first collective not every rank entered: #%d %s" % (seq, e["what"]))
            out.append("  entered by rank(s) %s; not by rank(s) %s"
                       % (", ".join(map(str, entered)), ", ".join(map(str, absent))))
            for r in absent:
                last = ranks[r]["entries"].get(last_seq(ranks[r]))
                out.append("  rank %d's last collective: %s" % (r, describe(last) if last else "none"))
            return out, True
        calls = {r: e["what"] for r, e in present.items()}
        if len(set(calls.values())) > 1:
            ref = calls[min(calls)]
            out.append("")
            out.append("first collective the ranks entered with different calls: #%d" % seq)
            for r in sorted(calls):
                out.append("  rank %d: %s%s" % (r, calls[r], "" if calls[r] == ref else "   <-- differs"))
            return out, True
        unfinished = sorted(r for r, e in present.items() if e["state"] != "completed")
        if unfinished:
            e = present[unfinished[0]]
            out.append("")
            out.append("first collective that did not complete everywhere: #%d %s" % (seq, e["what"]))
            for r in sorted(present):
                p = present[r]
                out.append("  rank %d: %s%s" % (r, p["state"], ("  " + p["error"][:200]) if p.get("error") else ""))
            return out, True
    if missing:
        return out, True
    out.append("")
    out.append("every rank entered and completed the same %d collective(s)" % (top - start + 1))
    return out, False


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="a folder, or flight_recorder.rank<r>.json files")
    args = parser.parse_args()
    files = []
    for p in args.paths:
        if os.path.isdir(p):
            files += sorted(glob.glob(os.path.join(p, "flight_recorder.rank*.json")))
        else:
            files.append(p)
    if not files:
        print("flight_recorder.py: no flight_recorder.rank<r>.json files in %s" % " ".join(args.paths),
              file=sys.stderr)
        return 2
    try:
        world, ranks = load(files)
    except (OSError, ValueError, KeyError) as e:
        print("flight_recorder.py: cannot read the records: %s" % e, file=sys.stderr)
        return 2
    lines, problem = analyse(world, ranks)
    print("\n".join(lines))
    return 1 if problem else 0


if __name__ == "__main__":
    sys.exit(main())
