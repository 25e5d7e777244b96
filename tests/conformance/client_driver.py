"""The Python client (spikeguard.Client) behind the conformance suite's line
protocol; client_driver.cc is the C++ twin, and test_client_conformance.py
holds the scenarios and documents the protocol.

One JSON object per line on stdin, one JSON answer per line on stdout.
StepReports and Commands travel as protobuf JSON. The driver decides
nothing: it calls the client and says what came back.
"""

from __future__ import annotations

import inspect
import json
import sys
import threading
import time

from google.protobuf import json_format

from spikeguard import Client, Rejected
from spikeguard.v1 import telemetry_pb2


class Driver:
    def __init__(self):
        self.client = None
        self.reporter = None
        self.reported = 0
        self.reporting = False

    def handle(self, req):
        op = req.get("op")
        if op == "defaults":
            return self.defaults()
        if op == "start":
            return self.start(req)
        if self.client is None:
            return {"ok": False, "error": "no client: send start first"}
        c = self.client
        if op == "report":
            return self.report(req)
        if op == "report_async":
            return self.report_async(req)
        if op == "progress":
            return {"ok": True, "reported": self.reported, "done": not self.reporting}
        if op == "flush":
            return self.call(lambda: c.flush(timeout=req.get("timeout_s", 30.0)))
        if op == "stats":
            s = c.stats
            rejection = c.rejection
            out = {"ok": True, "acked": s["reports_acked"], "duplicate": s["reports_duplicate"],
                   "rejected": s["reports_rejected"],
                   "already_committed": s["reports_already_committed"],
                   "batches_sent": s["batches_sent"], "heartbeats_sent": s["heartbeats_sent"],
                   "connects": s["connects"],
                   "connected": c.connected, "last_ack_message": s["last_ack_message"]}
            if rejection is not None:
                out["reason"] = Rejected(rejection).reason
            return out
        if op == "poll_command":
            cmd = c.poll_command(timeout=req.get("timeout_s", 0.0))
            return {"ok": True,
                    "command": None if cmd is None else json_format.MessageToDict(cmd)}
        if op == "command_result":
            c.command_result(req["id"], req["ok"], req.get("message", ""), req.get("step", 0))
            return {"ok": True}
        if op == "checkpoint_saved":
            c.checkpoint_saved(req["step"], req["uri"], data_position=req.get("data_position", 0))
            return {"ok": True}
        if op == "checkpoint_deleted":
            c.checkpoint_deleted(req["step"], req["uri"])
            return {"ok": True}
        if op == "generation_ended":
            c.generation_ended(req["generation"], req["last_step"], req.get("reason", ""))
            return {"ok": True}
        if op == "await_checkpoint_answers":
            return {"ok": c.await_checkpoint_answers(req.get("timeout_s", 10.0))}
        if op == "take_pins":
            return {"ok": True, "pins": c.take_pins()}
        if op == "close":
            self.close()
            return {"ok": True}
        return {"ok": False, "error": f"unknown op '{op}'"}

    @staticmethod
    def defaults():
        init = inspect.signature(Client.__init__).parameters
        return {"ok": True,
                "max_batch_reports": init["max_batch_reports"].default,
                "flush_interval_s": init["flush_interval"].default,
                "heartbeat_interval_s": init["heartbeat_interval"].default,
                "initial_backoff_s": init["initial_backoff"].default,
                "max_backoff_s": init["max_backoff"].default,
                "max_queued_reports": init["max_queued_reports"].default,
                "close_grace_s": init["close_grace"].default,
                "welcome_timeout_s": inspect.signature(Client.start).parameters["timeout"].default,
                "flush_timeout_s": inspect.signature(Client.flush).parameters["timeout"].default}

    def call(self, fn):
        """ok, or the error with the rejection's reason when the daemon refused."""
        try:
            fn()
            return {"ok": True}
        except Rejected as e:
            return {"ok": False, "error": str(e), "reason": e.reason}
        except Exception as e:  # TimeoutError, RuntimeError: said, not raised
            return {"ok": False, "error": f"{type(e).__name__}: {e}"}

    def start(self, req):
        if self.client is not None:
            return {"ok": False, "error": "already started"}
        self.client = Client(req["address"], req["run"], rank=req.get("rank", 0),
                             world_size=req.get("world_size", 1),
                             generation=req.get("generation", 0), host="conformance",
                             **req.get("options", {}))
        return self.call(lambda: self.client.start(timeout=req.get("timeout_s", 20.0)))

    @staticmethod
    def reports(req):
        return [json_format.ParseDict(r, telemetry_pb2.StepReport())
                for r in req.get("reports", [])]

    def report(self, req):
        reported = 0
        try:
            for r in self.reports(req):
                self.client.report(r)
                reported += 1
        except Rejected as e:
            return {"ok": False, "error": str(e), "reason": e.reason, "reported": reported}
        return {"ok": True, "reported": reported}

    def report_async(self, req):
        reports = self.reports(req)
        interval = req.get("interval_s", 0.0)
        if self.reporter is not None:
            self.reporter.join()
        self.reported = 0
        self.reporting = True

        def run():
            try:
                for r in reports:
                    self.client.report(r)
                    self.reported += 1
                    if interval > 0:
                        time.sleep(interval)
            except Exception:  # a rejection or close: progress says how far it got
                pass
            self.reporting = False

        self.reporter = threading.Thread(target=run, daemon=True)
        self.reporter.start()
        return {"ok": True}

    def close(self):
        if self.client is None:
            return
        self.client.close()  # unblocks a report() waiting under backpressure
        if self.reporter is not None:
            self.reporter.join()


def main():
    driver = Driver()
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = driver.handle(json.loads(line))
        except Exception as e:  # a driver bug or a bad line: answered, not fatal
            out = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    driver.close()


if __name__ == "__main__":
    main()
