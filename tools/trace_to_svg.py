#!/usr/bin/env python3
"""Draws Chrome trace-event JSON files (one per rank) as an SVG timeline.

One row per track of each process (rank): compute (forward, backward, the wait at the
end of backward), user scopes (optimizer.step), and one row per bucket's all-reduce.
Time runs left to right in milliseconds from the start of the window. Pure standard
library, so it runs anywhere Python 3.7+ does.

Examples:
  tools/trace_to_svg.py trace.rank0.json trace.rank1.json -o timeline.svg
  tools/trace_to_svg.py trace.rank*.json -o t.svg --iterations 3 --title "cnn, 2 ranks"
  tools/trace_to_svg.py trace.rank0.json -o t.svg --from-ms 120 --to-ms 180

Input: the JSON Array Format ([{...}, ...]) or the JSON Object Format
({"traceEvents": [...]}); complete events ("ph": "X") and begin/end pairs ("B"/"E");
metadata events name processes and threads (process_name, thread_name, *_sort_index).
"""

import argparse
import html
import json
import math
import sys

# Colour by what an event is; the first matching substring of its lower-cased name wins.
PALETTE = [
    ("wait", "#d62728"),
    ("all_reduce", "#ff7f0e"),
    ("allreduce", "#ff7f0e"),
    ("bucket", "#ff7f0e"),
    ("forward", "#1f77b4"),
    ("backward", "#2ca02c"),
    ("optimizer", "#9467bd"),
    ("step", "#9467bd"),
    ("zero_grad", "#8c564b"),
]
FALLBACK = ["#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#8c564b"]


def colour(name):
    low = name.lower()
    for key, c in PALETTE:
        if key in low:
            return c
    return FALLBACK[sum(map(ord, name)) % len(FALLBACK)]


def load_events(paths):
    """Returns (spans, process_names, thread_names, process_order, thread_order).
    spans: list of dicts {name, pid, tid, start, dur, args} with times in microseconds."""
    spans, pnames, tnames, porder, torder = [], {}, {}, {}, {}
    for path in paths:
        with open(path) as f:
            text = f.read()
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            # A trace cut short (the writer crashed mid-write): close the array ourselves.
            data = json.loads(text.rstrip().rstrip(",") + "]")
        events = data.get("traceEvents", []) if isinstance(data, dict) else data
        open_b = {}
        for e in events:
            ph = e.get("ph")
            pid, tid = e.get("pid", 0), e.get("tid", 0)
            if ph == "M":
                args = e.get("args", {})
                if e.get("name") == "process_name":
                    pnames[pid] = args.get("name", str(pid))
                elif e.get("name") == "thread_name":
                    tnames[(pid, tid)] = args.get("name", str(tid))
                elif e.get("name") == "process_sort_index":
                    porder[pid] = args.get("sort_index", pid)
                elif e.get("name") == "thread_sort_index":
                    torder[(pid, tid)] = args.get("sort_index", tid)
            elif ph == "X":
                spans.append({"name": e.get("name", "?"), "pid": pid, "tid": tid,
                              "start": float(e["ts"]), "dur": float(e.get("dur", 0)),
                              "args": e.get("args", {})})
            elif ph == "B":
                open_b.setdefault((pid, tid), []).append(e)
            elif ph == "E":
                stack = open_b.get((pid, tid))
                if stack:
                    b = stack.pop()
                    spans.append({"name": b.get("name", e.get("name", "?")), "pid": pid,
                                  "tid": tid, "start": float(b["ts"]),
                                  "dur": float(e["ts"]) - float(b["ts"]),
                                  "args": b.get("args", {})})
    return spans, pnames, tnames, porder, torder


def choose_window(spans, args):
    """(t0, t1, cut) in microseconds: draw [t0, t1), only spans that start before cut."""
    if not spans:
        raise SystemExit("trace_to_svg: no complete events in the input")
    first = min(s["start"] for s in spans)
    last = max(s["start"] + s["dur"] for s in spans)
    if args.from_ms is not None or args.to_ms is not None:
        t0 = first + 1000.0 * (args.from_ms or 0.0)
        t1 = first + 1000.0 * args.to_ms if args.to_ms is not None else last
        return t0, t1, t1
    if args.iterations:
        # An iteration starts at a "forward" span; take the last N complete ones of the
        # lowest process (rank 0). The window ends where the next forward starts, or at the
        # end of the trace.
        pid0 = min(s["pid"] for s in spans)
        starts = sorted(s["start"] for s in spans
                        if s["pid"] == pid0 and s["name"].lower() == args.iteration_event)
        if len(starts) >= 2:
            n = min(args.iterations, len(starts) - 1)
            t0 = starts[-n - 1]
            t1 = starts[-1]
            # Draw what began before the next forward, to its end (a bucket's all-reduce
            # may end after the next forward began), and nothing that began later.
            ends = [s["start"] + s["dur"] for s in spans if t0 <= s["start"] < t1]
            return t0, max([t1] + ends), t1
        if starts:
            return starts[-1], last, last
    return first, last, last


def human_bytes(n):
    for unit, scale in (("GB", 2**30), ("MB", 2**20), ("KB", 2**10)):
        if n >= scale:
            return "%.1f %s" % (n / scale, unit)
    return "%d B" % n


def nice_step(span_ms, target_ticks=8):
    raw = span_ms / max(target_ticks, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def fmt_ms(v):
    return ("%.3f" % v).rstrip("0").rstrip(".") if v else "0"


def render(spans, pnames, tnames, porder, torder, window, title, width, row_h):
    t0, t1, cut = window
    span_us = max(t1 - t0, 1.0)
    spans = [s for s in spans if s["start"] + s["dur"] > t0 and s["start"] < min(t1, cut)]
    rows = sorted({(s["pid"], s["tid"]) for s in spans},
                  key=lambda k: (porder.get(k[0], k[0]), k[0], torder.get(k, k[1]), k[1]))
    label_w = 190
    left, right, top = label_w + 10, 20, 50 if title else 24
    plot_w = width - left - right
    axis_h, legend_h = 34, 28

    def x(t):
        return left + (min(max(t, t0), t1) - t0) / span_us * plot_w

    # Depth of nested spans within a row (a span inside another one on the same track).
    depth_of, max_depth = {}, {}
    for key in rows:
        stack = []
        for s in sorted((s for s in spans if (s["pid"], s["tid"]) == key),
                        key=lambda s: (s["start"], -s["dur"])):
            while stack and stack[-1] <= s["start"]:
                stack.pop()
            depth_of[id(s)] = len(stack)
            max_depth[key] = max(max_depth.get(key, 0), len(stack))
            stack.append(s["start"] + s["dur"])

    row_y, y = {}, top
    prev_pid = None
    for key in rows:
        if prev_pid is not None and key[0] != prev_pid:
            y += row_h * 0.5  # a gap between ranks
        row_y[key] = y
        y += row_h
        prev_pid = key[0]
    height = int(y + axis_h + legend_h + 10)

    out = []
    out.append('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" '
               'viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" '
               'font-size="12">' % (width, height, width, height))
    out.append('<rect width="100%" height="100%" fill="white"/>')
    if title:
        out.append('<text x="%d" y="22" font-size="15" font-weight="bold">%s</text>'
                   % (left, html.escape(title)))

    # Grid and time axis.
    span_ms = span_us / 1000.0
    step = nice_step(span_ms)
    axis_y = y + 6
    tick = 0.0
    while tick <= span_ms + 1e-9:
        tx = left + tick / span_ms * plot_w
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#e6e6e6"/>'
                   % (tx, top - 4, tx, axis_y))
        out.append('<text x="%.1f" y="%.1f" text-anchor="middle" fill="#444">%s</text>'
                   % (tx, axis_y + 14, fmt_ms(tick)))
        tick += step
    out.append('<text x="%.1f" y="%.1f" text-anchor="middle" fill="#444">time (ms)</text>'
               % (left + plot_w / 2, axis_y + 29))

    # Rows.
    for key in rows:
        ry = row_y[key]
        pname = pnames.get(key[0], "rank %s" % key[0])
        tname = tnames.get(key, "track %s" % key[1])
        out.append('<text x="%d" y="%.1f" text-anchor="end" fill="#222">%s</text>'
                   % (label_w, ry + row_h * 0.62, html.escape("%s · %s" % (pname, tname))))
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#f0f0f0"/>'
                   % (left, ry + row_h, left + plot_w, ry + row_h))
        depth_n = max_depth.get(key, 0) + 1
        for s in spans:
            if (s["pid"], s["tid"]) != key:
                continue
            d = depth_of[id(s)]
            bar_h = (row_h - 6) / depth_n
            by = ry + 3 + d * bar_h
            x0, x1 = x(s["start"]), x(s["start"] + s["dur"])
            w = max(x1 - x0, 0.8)
            tip = "%s: %.3f ms" % (s["name"], s["dur"] / 1000.0)
            if s["args"]:
                tip += " " + json.dumps(s["args"], sort_keys=True)
            out.append('<rect x="%.2f" y="%.2f" width="%.2f" height="%.2f" fill="%s" '
                       'stroke="white" stroke-width="0.5"><title>%s</title></rect>'
                       % (x0, by, w, bar_h - 1, colour(s["name"]), html.escape(tip)))
            # The longest label that fits: name and size, size alone, name alone.
            labels = [s["name"]]
            nbytes = s["args"].get("bytes") if isinstance(s["args"], dict) else None
            if isinstance(nbytes, (int, float)) and nbytes > 0:
                labels = ["%s %s" % (s["name"], human_bytes(nbytes)), human_bytes(nbytes)]
            fits = [l for l in labels if w > 6.5 * len(l) + 6]
            label = fits[0] if fits else ""
            if label and bar_h >= 11:
                out.append('<text x="%.2f" y="%.2f" fill="white" font-size="11">%s</text>'
                           % (x0 + 3, by + bar_h / 2 + 4, html.escape(label)))

    # Legend: the names that appear, grouped by colour.
    seen = []
    for s in sorted(spans, key=lambda s: s["start"]):
        c = colour(s["name"])
        base = s["name"].split(" ")[0] if c == "#ff7f0e" else s["name"]
        if (c, base) not in seen and c not in [k for k, _ in seen]:
            seen.append((c, base))
    lx, ly = left, height - legend_h + 8
    for c, name in seen:
        out.append('<rect x="%d" y="%d" width="12" height="12" fill="%s"/>' % (lx, ly, c))
        out.append('<text x="%d" y="%d" fill="#222">%s</text>'
                   % (lx + 16, ly + 10, html.escape(name)))
        lx += 28 + 7 * len(name)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(
        description="Draw Chrome trace-event JSON files as an SVG timeline.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("traces", nargs="+", help="trace JSON files (one per rank)")
    ap.add_argument("-o", "--output", required=True, help="SVG file to write")
    ap.add_argument("--title", default="", help="title above the picture")
    ap.add_argument("--iterations", type=int, default=2,
                    help="show the last N complete iterations (0: the whole trace)")
    ap.add_argument("--iteration-event", default="forward",
                    help="name of the span that starts an iteration")
    ap.add_argument("--from-ms", type=float, default=None,
                    help="window start, ms after the first event (overrides --iterations)")
    ap.add_argument("--to-ms", type=float, default=None, help="window end, ms after the first event")
    ap.add_argument("--width", type=int, default=1100, help="picture width in pixels")
    ap.add_argument("--row-height", type=int, default=24, help="row height in pixels")
    args = ap.parse_args(argv)

    spans, pnames, tnames, porder, torder = load_events(args.traces)
    window = choose_window(spans, args)
    svg = render(spans, pnames, tnames, porder, torder, window, args.title, args.width,
                 args.row_height)
    with open(args.output, "w") as f:
        f.write(svg)
    print("trace_to_svg: wrote %s (%.2f ms window, %d spans)"
          % (args.output, (window[1] - window[0]) / 1000.0,
             sum(1 for s in spans
                 if s["start"] + s["dur"] > window[0] and s["start"] < min(window[1:]))),
          file=sys.stderr)


if __name__ == "__main__":
    main()
