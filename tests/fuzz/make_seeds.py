#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/ (run from anywhere; needs
protoc for the proto seeds). The seeds are committed; rerun this only to
change them. Each seed is a small valid (or nearly valid) input, so the
fuzzers start past the parsers' first checks."""
import os
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
CORPUS = os.path.join(HERE, "corpus")


def put(target, name, data):
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def encode(message, proto, text):
    return subprocess.run(
        ["protoc", "--encode=" + message, "-I", os.path.join(ROOT, "proto"), proto],
        input=text.encode(), stdout=subprocess.PIPE, check=True).stdout


# --- worker_message_fuzz: serialized WorkerMessages -------------------------
W = "spikeguard/v1/worker.proto"
WM = "spikeguard.v1.WorkerMessage"
worker = {
    "hello": 'hello { run: "r1" rank: 0 world_size: 2 generation: 0 host: "h" '
             'protocol: "spikeguard.v1" total_steps: 100 config_fingerprint: "cfg" '
             'data_order { dataset_fingerprint: "ds" global_batch_size: 8 sequence_length: 64 '
             'blend { key: "prose" value: 0.5 } blend { key: "code" value: 0.5 } } }',
    "batch": 'reports { reports { step: 1 data_position: 1 loss: 2.5 grad_norm: 0.5 tokens: 512 '
             'layers { layer: 0 max_attn_logit: 3 grad_norm: 0.1 } layers { layer: 1 } '
             'domain_losses { domain: "prose" loss: 2.4 tokens: 256 } '
             'documents { domain: "prose" id: 7 } } '
             'reports { step: 2 data_position: 2 loss: 2.4 nonfinite_count: 1 } }',
    "checkpoint": 'checkpoint { step: 10 data_position: 10 uri: "file:///tmp/c/ckpt-g0-s10.sgck" '
                  'bytes: 1000 checksum: "abcdef" complete: true }',
    "generation_ended": 'generation_ended { generation: 1 last_step: 99 reason: "end" }',
    "checkpoint_deleted": 'checkpoint_deleted { step: 10 uri: "file:///tmp/c/x.sgck" }',
    "heartbeat": 'heartbeat { step: 3 unix_ms: 1000 }',
}
for name, text in worker.items():
    put("worker_message_fuzz", name, encode(WM, W, text))

# --- supervisor_request_fuzz: method byte + request --------------------------
# The byte picks the method by its index among the unary RPCs, which moves
# when supervisor.proto changes; the seeds stay useful as request bytes.
S = "spikeguard/v1/supervisor.proto"
sup = [
    (1, "spikeguard.v1.CreateRunRequest", 'name: "r1" world_size: 2'),
    (2, "spikeguard.v1.GetRunRequest", 'name: "r1"'),
    (7, "spikeguard.v1.QueryTelemetryRequest", 'run: "r1" from_step: 0 metrics: "loss" metrics: "max_attn_logit"'),
    (12, "spikeguard.v1.SkipRequest", 'run: "r1"'),
    (18, "spikeguard.v1.SetPolicyRequest", 'run: "r1" policy { loss_spike { window: 64 min_samples: 32 z_threshold: 5 } }'),
    (21, "spikeguard.v1.AddQuarantineRequest", 'entry { run: "r1" domain: "prose" reason: "junk" }'),
]
for i, (index, message, text) in enumerate(sup):
    try:
        put("supervisor_request_fuzz", "req%d" % i, bytes([index]) + encode(message, S, text))
    except subprocess.CalledProcessError:
        print("skipped", message, file=sys.stderr)

# --- policy_text_fuzz ------------------------------------------------------
put("policy_text_fuzz", "full", """mode: MODE_AUTO
loss_spike { window: 128 min_samples: 64 z_threshold: 6 relative_floor: 0.05 recovery_steps: 50 }
grad_norm_spike { window: 64 min_samples: 32 z_threshold: 8 }
precursor { trend_window: 50 trend_z_threshold: 4 attn_logit_warn: 30 attn_logit_critical: 50 persistence_steps: 5 }
probe { min_steps_before_onset: 10 max_steps_before_onset: 500 replay_steps_past_onset: 20
        skip_before: 5 skip_after: 5 skip_horizon: 400 bisect: true transplant: true
        bisect_documents: true max_document_probes: 8 }
budget { max_probes: 6 max_reexecuted_steps: 5000 }
escalation { data_incidents: 3 window_steps: 10000 }
fix { verify_steps: 200 lr_factor: 0.5 extra_warmup_steps: 100 tight_clip_norm: 0.5 beta2: 0.95 eps: 1e-8 }
launch { heartbeat_timeout_ms: 30000 max_restarts: 3 }
""")
put("policy_text_fuzz", "small", "probe { skip_horizon: 400 skip_before: 0 }\n")
put("policy_text_fuzz", "bad", "loss_spike { window: -3 }\n# comment\n")

# --- checkpoint_fuzz: mode byte 0 + body (the harness adds the trailer) -------
def s32(b):
    return struct.pack("<I", len(b)) + b


body = b"SGCKPT\0\0" + struct.pack("<II", 1, 0) + struct.pack("<qqq", 3, 1200, 1210)
body += s32(b"gpt-4L-128d:9c1e") + s32(b"rng")
body += struct.pack("<I", 1) + s32(b"lr_scale") + s32(b"0.7")
body += struct.pack("<I", 2) + s32(b"params") + struct.pack("<Q", 8) + b"\1\2\3\4\5\6\7\x08"
body += s32(b"adam_m") + struct.pack("<Q", 0)
put("checkpoint_fuzz", "valid", b"\0" + body)
put("checkpoint_fuzz", "raw_bad_checksum", b"\1" + body + b"\0" * 8 + b"SGCKEND\0")

# --- indexed_dataset_fuzz: .idx, then the .bin size (u16) --------------------
def idx(dtype, lengths, pointers, docs):
    out = b"MMIDIDX\0\0" + struct.pack("<Q", 1) + bytes([dtype])
    out += struct.pack("<QQ", len(lengths), len(docs))
    out += b"".join(struct.pack("<i", x) for x in lengths)
    out += b"".join(struct.pack("<q", x) for x in pointers)
    out += b"".join(struct.pack("<q", x) for x in docs)
    return out


put("indexed_dataset_fuzz", "uint8", idx(1, [5, 3, 4], [0, 5, 8], [0, 1, 3]) + struct.pack("<H", 12))
put("indexed_dataset_fuzz", "uint16", idx(8, [2, 2], [0, 4], [0, 2]) + struct.pack("<H", 8))
put("indexed_dataset_fuzz", "int32_modes", idx(4, [1], [0], [0, 1]) + b"\0" + struct.pack("<H", 4))

# --- data_plan_fuzz -----------------------------------------------------------
put("data_plan_fuzz", "default", "0-")
put("data_plan_fuzz", "hole", "0-600,610-")
put("data_plan_fuzz", "splice", "0-300,600-610,300-600,610-")
put("data_plan_fuzz", "mask", "0-600,610-;drop=300:0.1.5;drop=700:2")
put("data_plan_fuzz", "bounded", "5-10, 20-30")

# --- trace_fuzz: JSONL reports, labels JSON -----------------------------------
put("trace_fuzz", "jsonl",
    '{"step": "1", "loss": 2.5, "grad_norm": 0.5, "layers": [{"layer": 0, "max_attn_logit": 3}]}\n'
    '{"step": "2", "loss": "NaN", "nonfinite_count": "1"}\n'
    '{"step": "1", "loss": "Infinity"}\n')
put("trace_fuzz", "labels",
    '{"trace": "sharp_spikes-3", "steps": 5000, "labels": [\n'
    '  {"kind": "spike", "onset": 1201, "peak": 1203, "end": 1221},\n'
    '  {"kind": "precursor", "signal": "max_attn_logit", "layer": 2, "onset": 900, "peak": 1203, "end": 1203}]}\n')
