#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets, fuzz/corpus/<name>/ (fuzz/README.md).

Run with ddp-cpp's pip torch for the DCP files (scripts/config.sh's DDP_PY):
    ~/.cache/ddp-cpp/torch-2.15.0/bin/python fuzz/make-corpus.py
Without torch the DCP `.metadata` files are left as they are. Files are rewritten, never
deleted; every file is small (16 KB at most) and each folder holds at most 30.
"""
import collections
import dataclasses
import os
import pickle
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    assert len(data) <= (16384 if target in ("zip_archive", "torch_load") else 8192), (
        target, name, len(data))
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def damaged(data):
    """A cut, a flipped byte and bytes after the end, of one valid input."""
    cut = data[: len(data) * 2 // 3]
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0x5A
    return {"cut": cut, "flipped": bytes(flipped), "trailing": data + b"\x00garbage"}


@dataclasses.dataclass
class Point:  # pickled as __main__.Point, which the py_pickle target allows
    x: int
    y: float


# --- DCP .metadata (torch.distributed.checkpoint, one process) ---------------------------
def dcp_metadata_files():
    try:
        import torch
        import torch.distributed.checkpoint as dcp
    except ImportError:
        print("make-corpus: no torch; the DCP files are left as they are", file=sys.stderr)
        return {}
    torch.manual_seed(0)
    state_dicts = {
        "one_tensor": {"w": torch.randn(4, 3)},
        "dtypes": {
            "f64": torch.zeros(2, dtype=torch.float64),
            "bf16": torch.zeros(3, 2, dtype=torch.bfloat16),
            "i64": torch.arange(5),
            "i8": torch.zeros(2, dtype=torch.int8),
            "u8": torch.zeros(2, dtype=torch.uint8),
            "b": torch.zeros(2, dtype=torch.bool),
            "c64": torch.zeros(2, dtype=torch.complex64),
            "f16": torch.zeros(1, dtype=torch.float16),
        },
        "nested": {
            "model": {"layer": {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}},
            "optim": {"state": {0: {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]},
            "step": 7,
            "lst": [torch.ones(1), torch.ones(2)],
        },
        "scalar_and_empty": {"s": torch.tensor(1.5), "e": torch.zeros(0, 3), "n": "text"},
        "requires_grad": {"p": torch.nn.Parameter(torch.ones(3, 1))},
    }
    out = {}
    for name, sd in state_dicts.items():
        with tempfile.TemporaryDirectory() as d:
            dcp.save(sd, checkpoint_id=d, no_dist=True)
            with open(os.path.join(d, ".metadata"), "rb") as f:
                out[name] = f.read()
    return out


def py_pickle_corpus(dcp_files):
    plain = {
        "ints": [0, 1, -1, 255, 256, 65535, 65536, -(2**31), 2**31, 2**63 - 1, -(2**63)],
        "floats": (0.5, -0.0, float("inf"), float("nan"), 1e308),
        "text": "héllo \u20ac \U0001f600",
        "bytes": b"\x00\x01\xff",
        "none": None,
        "flags": [True, False],
        "nested": {"a": [{"b": ()}], "t1": (1,), "t2": (1, 2), "t3": (1, 2, 3), "t4": (1, 2, 3, 4)},
    }
    for p in range(6):
        put("py_pickle", f"plain_p{p}.pkl", pickle.dumps(plain, protocol=p))
    shared = [1, 2]
    put("py_pickle", "shared_p4.pkl", pickle.dumps({"x": shared, "y": shared, "z": (shared,)}, 4))
    od = collections.OrderedDict([("b", 1), ("a", 2)])
    put("py_pickle", "ordered_p2.pkl", pickle.dumps(od, 2))
    put("py_pickle", "ordered_p4.pkl", pickle.dumps(od, 4))
    put("py_pickle", "sets_p4.pkl", pickle.dumps([{1, 2}, frozenset({3})], 4))
    put("py_pickle", "point_p0.pkl", pickle.dumps(Point(1, 2.5), 0))
    put("py_pickle", "point_p2.pkl", pickle.dumps([Point(1, 2.5), Point(-3, 0.0)], 2))
    put("py_pickle", "big_long_p2.pkl", pickle.dumps([2**64, -(2**70)], 2))  # refused: > 64 bits
    # Python 2's pickles: STRING, INT/LONG text, the old module names.
    put("py_pickle", "py2_p0.pkl", b"(dp0\nS'a\\x41\\n'\np1\nI01\nsS'b'\np2\nL12345678901L\nsV\\u20ac\np3\n(lp4\nF1.5\naI-7\nas.")
    put("py_pickle", "py2_global_p0.pkl", b"c__builtin__\nset\np0\n((lp1\nI1\natp2\nRp3\n.")
    put("py_pickle", "empty_p4.pkl", pickle.dumps({}, 4))
    put("py_pickle", "framed_p5.pkl", pickle.dumps(list(range(40)), 5))
    # Refused on purpose: code-running opcodes and unknown globals.
    put("py_pickle", "refused_os_system.pkl", b"cos\nsystem\n(S'true'\ntR.")
    put("py_pickle", "refused_persid.pkl", b"\x80\x02Pfoo\n.")
    put("py_pickle", "refused_cycle.pkl", b"\x80\x04]\x94h\x00a.")
    for name in ("one_tensor", "nested"):
        if name in dcp_files:
            put("py_pickle", f"dcp_{name}.metadata", dcp_files[name])
    base = pickle.dumps(plain, 4)
    for kind, data in damaged(base).items():
        put("py_pickle", f"plain_p4_{kind}.pkl", data)


def dcp_corpus(dcp_files):
    for name, data in dcp_files.items():
        put("dcp_metadata", f"{name}.metadata", data)
    if "one_tensor" in dcp_files:
        for kind, data in damaged(dcp_files["one_tensor"]).items():
            put("dcp_metadata", f"one_tensor_{kind}.metadata", data)
        # Another dtype name, and the class of torch < 2.4 for TensorProperties.
        data = dcp_files["one_tensor"]
        put("dcp_metadata", "float64_for_float32.metadata", data.replace(b"float32", b"float64"))
        # TensorProperties names its module by BINGET 0: name torch < 2.4's module instead
        # (no MEMOIZE, so the memo keeps its indices; FRAME's length is only a hint).
        old = b"torch.distributed._shard.sharded_tensor.metadata"
        at = data.find(b"h\x00\x8c\x10TensorProperties")
        if at > 0:
            put("dcp_metadata", "old_tensor_properties.metadata",
                data[:at] + b"\x8c" + bytes([len(old)]) + old + data[at + 2:])
    put("dcp_metadata", "not_metadata.pkl", pickle.dumps({"a": 1}, 4))


def wire_corpus():
    lines = {
        "hello": "hello 1 2 4",
        "hello_c10d": "hello -1 2 4 100",
        "hello_range": "hello -1 2:3 4 100",
        "fail": "fail 0 5 rank 3 failed",
        "fail_no_why": "fail 0 3",
        "finished": "finished 2",
        "stopped": "stopped 1",
        "abort_agent": "abort 130 stopped by SIGINT on b",
        "rejoin": "rejoin 2 5 job42",
        "ping": "ping",
        "empty": "",
        "welcome": "welcome 3",
        "go": "go 0 0 abc123",
        "go_members": "go 3 1 abc123 0,2",
        "peers": "peers 0=10.0.0.1,2=fd00::3",
        "restart": "restart 2 1 2 rank 3 failed",
        "done": "done",
        "abort_node0": "abort 5 1 rank 3 failed",
        "error": "error --node-rank 1 has already joined",
        "bad_hello": "hello 1 2 3x",
        "bad_go": "go 0 0 abc 1,x",
        "bad_peers": "peers 1=a,",
        "spaces": "  fail  0   3  why  ",
    }
    for name, line in lines.items():
        put("ddprun_wire", name, line)
    put("ddprun_wire", "session_agent", "hello 1 2 4\nping\nfail 0 1 rank 4 failed\nstopped 1\nfinished 1\n")
    put("ddprun_wire", "session_node0", "welcome 1\npeers 0=a,1=b\ngo 0 0 r 0,1\nrestart 1 1 1 why\ngo 1 1 r\ndone\n")


def options_corpus():
    lines = {
        "simple": ["--nproc-per-node", "4", "./train", "--epochs", "3"],
        "dashdash": ["--nproc-per-node", "2", "--", "/bin/true", "-x"],
        "torchrun_c10d": ["--nnodes=2", "--nproc-per-node=8", "--rdzv-id=100",
                          "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.1:29400", "train.py"],
        "static_two_hosts": ["--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                             "--master-port", "29500", "--nproc-per-node", "4", "--", "./train"],
        "elastic": ["--nnodes", "1:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", "[fe80::1]:29400",
                    "--rdzv-conf", "join_timeout=600,last_call_timeout=30", "--max-restarts", "3", "sh"],
        "logs": ["--log-dir", "/tmp/logs", "-r", "3", "-t", "1", "--local-ranks-filter", "0,1",
                 "--no-prefix", "--role", "trainer", "--run-id", "job42", "ls"],
        "module": ["-m", "--standalone", "--nproc_per_node", "cpu", "pkg.mod"],
        "no_python": ["--no-python", "--start-method", "fork", "--grace-period", "2.5", "x.py"],
        "run_path": ["--run-path", "--monitor-interval", "0.5", "--shutdown-timeout", "1", "script"],
        "help": ["--help"],
        "unsupported": ["--use-env", "train.py"],
        "unknown": ["--bogus", "1", "train"],
        "bad_nnodes": ["--nnodes", "3:2", "true"],
        "bad_port": ["--master-port", "70000", "true"],
        "missing_program": ["--nproc-per-node", "2"],
        "gpu": ["--nproc-per-node", "gpu", "true"],
        "conflict": ["--no-python", "-m", "x"],
    }
    for name, args in lines.items():
        put("ddprun_options", name, "\0".join(args))


def gpt_corpus():
    rec = ('{"step":%d,"epoch":%d,"train_loss":%s,"val_loss":2.45,"tokens_per_s":21000.5,'
           '"seconds":%s,"world_size":2}')
    put("gpt_metrics", "one", rec % (50, 1, "2.41", "12.3") + "\n")
    put("gpt_metrics", "three", "".join(rec % (50 * i, i, str(3 - i / 2), str(12.3 * i)) + "\n"
                                        for i in range(1, 4)))
    put("gpt_metrics", "no_val", '{"step":10,"epoch":1,"train_loss":4.1,"tokens_per_s":100,'
                                 '"seconds":1,"world_size":1}\n')
    put("gpt_metrics", "no_train", '{"step":10,"epoch":1,"val_loss":4.1,"tokens_per_s":1e5,'
                                   '"seconds":0.5,"world_size":4}\n\n')
    put("gpt_metrics", "cut", rec % (50, 1, "2.41", "12.3") + "\n" + '{"step":100,"epo')
    put("gpt_metrics", "missing_field", '{"step":1,"epoch":1}\n')
    put("gpt_metrics", "wrong_type", '{"step":"1","epoch":1,"tokens_per_s":1,"seconds":1,'
                                     '"world_size":1}\n')
    put("gpt_metrics", "empty", "")
    put("gpt_metrics", "not_json", "step 50 loss 2.4\n")
    put("gpt_metrics", "crlf", (rec % (5, 1, "2", "1")) + "\r\n")


# --- torch.save files (zip_archive, torch_load) ------------------------------------------

def torch_save_files():
    """Small torch.save files of what a checkpoint holds, from this Python's torch."""
    try:
        import io
        import torch
    except ImportError:
        print("make-corpus: no torch here: the torch.save files are left as they are")
        return {}
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)  # the torch_load target's model
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1)
    lin(torch.ones(1, 3)).sum().backward()
    opt.step()
    # The optimizer in ddp::save_checkpoint's layout (src/formats/optimizer_state.cpp).
    ddp_opt = dict(opt.state_dict())
    ddp_opt["type"] = "AdamW"
    ddp_opt["param_names"] = ["weight", "bias"]
    values = {
        "tensor_dict": {"w": torch.arange(4.0), "b": torch.zeros(2, dtype=torch.int64)},
        "module_state": lin.state_dict(),  # an OrderedDict with _metadata (BUILD)
        "optimizer_state": opt.state_dict(),
        "ddp_optimizer": ddp_opt,
        "checkpoint": {"model": lin.state_dict(), "optimizer": ddp_opt, "epoch": 3, "step": 12,
                       "rng": {"cpu": torch.get_rng_state(), "cuda": []},
                       "sampler": {"epoch": 1, "seed": 0}, "extra": {"name": "x", "v": 1.5}},
        "views": {"a": torch.arange(6.0).view(2, 3).t(), "half": torch.ones(3, dtype=torch.float16)},
        "empty": {},
    }
    files = {}
    for name, value in values.items():
        buf = io.BytesIO()
        torch.save(value, buf)
        files[name] = buf.getvalue()
    return files


def torch_save_corpus(files):
    for target in ("zip_archive", "torch_load"):
        for name, data in files.items():
            put(target, f"{name}.pt", data)
        if "tensor_dict" in files:
            for kind, data in damaged(files["tensor_dict"]).items():
                put(target, f"tensor_dict_{kind}.pt", data)
        put(target, "plain_pickle.pkl", pickle.dumps({"a": 1}, 2))


# --- host identities, IDX files, GPT corpora ---------------------------------------------

def host_identity_corpus():
    a = ("host-v2 node0 0f1e2d3c-aaaa-bbbb-cccc-123456789abc 22 1 4026531836 1234 4026531840 2 "
         "10.0.0.1/24/eth0 192.168.1.5/16/wlan0")
    b = "host-v2 node1 1f1e2d3c-aaaa-bbbb-cccc-123456789abc 22 1 4026531836 99 4026531841 1 10.0.0.2/24/eth0"
    same = "host-v2 node0 0f1e2d3c-aaaa-bbbb-cccc-123456789abc 22 1 4026531836 1235 4026531840 0"
    put("host_identity", "two_hosts", a + "\n" + b)
    put("host_identity", "one_host", a + "\n" + a.replace("1234", "1235"))
    put("host_identity", "v1_and_v2", "host-v1 node0 - 22 1 4026531836 7\n" + b)
    put("host_identity", "no_addresses", same + "\n" + same.replace("1235", "1236"))
    put("host_identity", "older_peer", "1\n" + a)


def idx_corpus():
    import gzip
    import struct
    images = struct.pack(">IIII", 0x803, 2, 28, 28) + bytes(range(256)) * 6 + bytes(32)
    labels = struct.pack(">II", 0x801, 4) + bytes([0, 9, 3, 1])
    put("idx", "images", images)
    put("idx", "labels", labels)
    put("idx", "labels.gz", gzip.compress(labels, mtime=0))
    put("idx", "images_3x3", struct.pack(">IIII", 0x803, 1, 3, 3) + bytes(9))
    put("idx", "label_10", struct.pack(">II", 0x801, 1) + bytes([10]))
    for kind, data in damaged(labels).items():
        put("idx", f"labels_{kind}", data)


def gpt_text_corpus():
    put("gpt_text", "ascii", "First Citizen:\nBefore we proceed any further, hear me speak.\n" * 3)
    put("gpt_text", "utf8", "Grüße, καλημέρα, 你好! 🙂 " * 8)
    put("gpt_text", "short", "abcdefghij")
    put("gpt_text", "bad_utf8", b"abc\xff\xfe def" * 10)
    put("gpt_text", "cut_utf8", ("é" * 40).encode()[:-1])


def main():
    host_identity_corpus()
    idx_corpus()
    gpt_text_corpus()
    torch_save_corpus(torch_save_files())
    dcp_files = dcp_metadata_files()
    py_pickle_corpus(dcp_files)
    dcp_corpus(dcp_files)
    wire_corpus()
    options_corpus()
    gpt_corpus()
    for name in sorted(os.listdir(os.path.join(HERE, "corpus"))):
        files = os.listdir(os.path.join(HERE, "corpus", name))
        assert len(files) <= 30, (name, len(files))
        print(f"make-corpus: {name}: {len(files)} files")


if __name__ == "__main__":
    main()
