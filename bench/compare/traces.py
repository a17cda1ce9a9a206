"""What run.py reads from ddp-cpp's Chrome traces (one per rank; timestamps in
microseconds of the system clock, so the ranks of one host share a time axis).

Per reduced iteration (the "iteration" argument DDP puts on its events):
  hidden share  per rank: (end of backward - first bucket launch) /
                (end of the end-of-backward wait - first bucket launch),
                which is how PyTorch's reducer defines backward_compute_comm_overlap_time /
                backward_comm_time;
  busbw         all bucket bytes over the time communication was in flight: the union
                over buckets of [last rank's launch, first rank's completion]. An
                all-reduce cannot start before every rank has launched it, so the earlier
                ranks' waiting is skew, not transfer; and buckets in flight at the same
                time are counted once.
"""


def _iterations(events, skip):
    per_iter = {}
    for e in events:
        if e.get("ph") != "X":
            continue
        it = (e.get("args") or {}).get("iteration")
        if it is None or it <= skip:
            continue
        d = per_iter.setdefault(it, {"buckets": {}, "bwd_end": None, "wait_end": None})
        end = e["ts"] + e.get("dur", 0)
        if e["name"] == "all_reduce":
            d["buckets"][e["args"].get("bucket")] = (e["ts"], end, e["args"].get("bytes", 0))
        elif e["name"] == "backward":
            d["bwd_end"] = end
        elif e["name"] == "backward.wait":
            d["wait_end"] = end
    return per_iter


def hidden_shares(events, skip=0):
    shares = []
    for d in _iterations(events, skip).values():
        if d["buckets"] and d["bwd_end"] is not None and d["wait_end"] is not None:
            first = min(b[0] for b in d["buckets"].values())
            window = d["wait_end"] - first
            if window > 0:
                shares.append(min(1.0, max(0.0, (d["bwd_end"] - first) / window)))
    return shares


def _union_length(intervals):
    total, end = 0.0, None
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if end is None or a >= end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def bucket_busbw(rank_events, skip=0):
    """GB/s per iteration present in every rank's trace."""
    ranks = [_iterations(ev, skip) for ev in rank_events]
    world = len(ranks)
    out = []
    for it in sorted(set.intersection(*[set(r) for r in ranks])):
        per_rank = [r[it]["buckets"] for r in ranks]
        ids = set.intersection(*[set(b) for b in per_rank])
        if not ids:
            continue
        intervals, nbytes = [], 0
        for b in ids:
            start = max(r[b][0] for r in per_rank)
            end = min(r[b][1] for r in per_rank)
            intervals.append((start, max(start, end)))
            nbytes += per_rank[0][b][2]
        us = _union_length(intervals)
        if us > 0:
            out.append(nbytes / (us / 1e6) / 1e9 * 2.0 * (world - 1) / world)
    return out
