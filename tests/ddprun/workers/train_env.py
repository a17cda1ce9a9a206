#!/usr/bin/env python3
"""A stand-in training script for torchrun command lines: writes what the launcher gave
it (environment and arguments) to $TRAIN_ENV_OUT/rank<RANK>.json and prints one line.
Runs as a script or as a module (python3 -m train_env)."""
import json
import os
import sys

NAMES = ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
         "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT",
         "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID"]

info = {name: os.environ.get(name) for name in NAMES}
info["argv"] = sys.argv[1:]
info["as_module"] = __spec__ is not None
out_dir = os.environ["TRAIN_ENV_OUT"]
name = "rank%s.attempt%s.json" % (info["RANK"], info["TORCHELASTIC_RESTART_COUNT"])
with open(os.path.join(out_dir, name + ".tmp"), "w") as f:
    json.dump(info, f)
os.rename(os.path.join(out_dir, name + ".tmp"), os.path.join(out_dir, name))
print("rank %s of %s ready" % (info["RANK"], info["WORLD_SIZE"]), flush=True)
sys.exit(3 if os.environ.get("TRAIN_ENV_EXIT_RANK") == info["RANK"] else 0)
