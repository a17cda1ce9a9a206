"""PyTorch's side of tests/amp/amp_python_test.cpp.

  grad_scaler_reference.py sequence SPEC_JSON OUT_JSON [SPEC_JSON OUT_JSON ...]
      For each pair, runs torch.amp.GradScaler("cpu") over the gradient sequence in SPEC_JSON: a parameter
      w (float32, "w0"), SGD with "lr", and per step the loss sum(w * c) for the step's c
      (numbers, or "inf", "-inf", "nan"), through scaler.scale(loss).backward(),
      scaler.step(opt), scaler.update(). Writes per step the scale, the growth tracker and
      whether the step was taken, the final w and the final state_dict().

Where torch has no CPU GradScaler (python3-torch 1.13: torch.cuda.amp.GradScaler only
works on CUDA tensors), writes {"available": false, "torch": <version>}.
"""
import json
import sys

import torch


def as_float(v):
    return float(v)  # float("inf"), float("nan") parse the strings too


def sequence(spec_path, out_path):
    with open(spec_path) as f:
        spec = json.load(f)
    result = {"torch": torch.__version__}
    if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
        result["available"] = False
        with open(out_path, "w") as f:
            json.dump(result, f)
        return
    result["available"] = True
    w = torch.nn.Parameter(torch.tensor([as_float(v) for v in spec["w0"]], dtype=torch.float32))
    opt = torch.optim.SGD([w], lr=spec["lr"])
    scaler = torch.amp.GradScaler("cpu", init_scale=spec["init_scale"],
                                  growth_factor=spec["growth_factor"],
                                  backoff_factor=spec["backoff_factor"],
                                  growth_interval=spec["growth_interval"])
    steps = []
    for c_values in spec["steps"]:
        c = torch.tensor([as_float(v) for v in c_values], dtype=torch.float32)
        opt.zero_grad()
        scaler.scale((w * c).sum()).backward()
        scaler.step(opt)
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        scaler.update()
        steps.append({"stepped": found == 0, "scale": scaler.get_scale(),
                      "tracker": scaler.state_dict()["_growth_tracker"]})
    result["steps"] = steps
    result["w"] = w.detach().tolist()
    result["state_dict"] = scaler.state_dict()
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    if len(sys.argv) >= 4 and len(sys.argv) % 2 == 0 and sys.argv[1] == "sequence":
        for i in range(2, len(sys.argv), 2):
            sequence(sys.argv[i], sys.argv[i + 1])
    else:
        sys.exit(__doc__)
