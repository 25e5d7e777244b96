#!/usr/bin/python3
"""Shrinks telemetry JSONL (StepReports, one per line, as spikeguard-worker
and worker/examples/torch_gpt write them) to the fields the detectors read,
with 6 significant digits: step, loss, grad_norm, clipped, lse_mean, lse_max,
nonfinite_count, domain_losses (domain, loss, tokens) and layers (layer,
max_attn_logit, grad_norm, update_ratio, act_rms).

    compact.py IN.jsonl OUT.jsonl
"""
import json
import sys

SCALARS = ["loss", "grad_norm", "lse_mean", "lse_max"]
LAYER = ["max_attn_logit", "grad_norm", "update_ratio", "act_rms"]


def g(x):
    if isinstance(x, str):  # proto JSON spells non-finite values "NaN", "Infinity"
        return float(x)
    return float(f"{float(x):.6g}")


def main(src, dst):
    with open(src) as f, open(dst, "w") as out:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            c = {"step": int(r["step"])}
            for k in SCALARS:
                if k in r:
                    c[k] = g(r[k])
            if r.get("clipped"):
                c["clipped"] = True
            if int(r.get("nonfinite_count", 0)):
                c["nonfinite_count"] = int(r["nonfinite_count"])
            if r.get("domain_losses"):
                c["domain_losses"] = [{"domain": d["domain"], "loss": g(d.get("loss", 0)),
                                       "tokens": int(d.get("tokens", 0))}
                                      for d in r["domain_losses"]]
            if r.get("layers"):
                c["layers"] = [dict({"layer": int(l.get("layer", 0))},
                                    **{k: g(l[k]) for k in LAYER if k in l})
                               for l in r["layers"]]
            out.write(json.dumps(c, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
