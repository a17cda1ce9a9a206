#!/usr/bin/env python3
"""Writes the launcher-given environment to DIR/rank<RANK>.attempt<N>.json."""
import json
import os
import stat
import sys

NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
         "DDP_RUN_ID", "DDP_RENDEZVOUS_DIR", "OMP_NUM_THREADS", "DDPRUN_TEST_MARKER",
         "DDPRUN_RDZV_LISTEN_FD"]

out_dir = sys.argv[1]
info = {name: os.environ.get(name) for name in NAMES}
info["pid"] = os.getpid()
info["pgid"] = os.getpgid(0)
info["argv"] = sys.argv[2:]
info["stdin_is_devnull"] = os.path.samestat(os.fstat(0), os.stat("/dev/null"))
rdzv = info["DDP_RENDEZVOUS_DIR"]
if rdzv:
    st = os.stat(rdzv)
    info["rdzv_is_dir"] = stat.S_ISDIR(st.st_mode)
    info["rdzv_mode"] = stat.S_IMODE(st.st_mode)
name = "rank%s.attempt%s.json" % (info["RANK"], info["TORCHELASTIC_RESTART_COUNT"])
tmp = os.path.join(out_dir, name + ".tmp")
with open(tmp, "w") as f:
    json.dump(info, f)
os.rename(tmp, os.path.join(out_dir, name))
print("rank %s wrote %s" % (info["RANK"], name))
sys.exit(int(os.environ.get("DUMP_ENV_EXIT", "0")))
