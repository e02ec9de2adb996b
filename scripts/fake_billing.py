#!/usr/bin/env python3
"""A stand-in billing service for the http controller in tests.

Answers POST with {"result": "purchased"} after --delay-ms (or with the result named in the
request's attributes.answer, for scripted stories), logs each request id it was called with (one per
line, flushed) to --log, and answers 503 to the first attempt of every request whose id ends in "7"
(so retries are exercised). Prints "port=N" once listening; stops on SIGTERM.

Each log line is "<request_id> <attempt> <idempotency key> sig=<ok|bad|none> tp=<traceparent|->".
With --secret FILE, a call whose Encore-Signature does not verify (HMAC-SHA256 of "<t>.<body>"
with the file's secret, t within 5 minutes) is answered 401. Paths: /redirect answers 307 to
/followed (which logs "FOLLOWED"); /huge answers 502 with a 5 MB body; /garbage answers 200 with
a body that is not JSON; /huge200 answers 200 with 100 MB beginning {"result":"purchased" (streamed
until the caller hangs up); /in-progress answers 409 idempotency_key_in_use.
"""
import hashlib
import hmac
import argparse
import http.server
import json
import signal
import sys
import threading
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--delay-ms", type=float, default=0)
    parser.add_argument("--log", required=True)
    parser.add_argument("--secret", help="file holding the signing secret")
    args = parser.parse_args()
    secret = open(args.secret, "rb").read().rstrip(b"\r\n") if args.secret else None

    def verify(header, body):
        """How billing checks Encore-Signature: recompute, compare in constant time, refuse old ones."""
        if not header:
            return "none"
        fields = dict(part.split("=", 1) for part in header.split(",") if "=" in part)
        try:
            fresh = abs(time.time() - int(fields.get("t", "0"))) <= 300
        except ValueError:
            return "bad"
        expected = hmac.new(secret or b"", fields.get("t", "").encode() + b"." + body, hashlib.sha256).hexdigest()
        return "ok" if fresh and hmac.compare_digest(expected, fields.get("v1", "")) else "bad"
    log = open(args.log, "a", buffering=1)
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_):
            pass

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            request = json.loads(body)
            attempt = int(self.headers.get("Encore-Attempt", "1"))
            key = self.headers.get("Idempotency-Key")
            signature = verify(self.headers.get("Encore-Signature"), body)
            traceparent = self.headers.get("traceparent") or "-"
            with lock:
                if self.path.startswith("/followed"):
                    log.write("FOLLOWED\n")
                log.write(f"{request['request_id']} {attempt} {key} sig={signature} tp={traceparent}\n")
            time.sleep(args.delay_ms / 1000)
            if self.path.startswith("/redirect"):
                self.send_response(307)
                self.send_header("Location", f"http://127.0.0.1:{self.server.server_address[1]}/followed")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if self.path.startswith("/garbage"):
                payload = b"\x00\x01 not json {"
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            if self.path.startswith("/huge200"):
                size = 100 * 1024 * 1024
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(size))
                self.end_headers()
                chunk = b'{"result":"purchased"' + b" " * (65536 - 21)
                try:
                    for _ in range(size // len(chunk)):
                        self.wfile.write(chunk)
                        chunk = b" " * 65536
                except OSError:
                    pass  # the caller stopped reading
                return
            if self.path.startswith("/in-progress"):
                # Billing still works on a call with this Idempotency-Key (Stripe's
                # idempotency_key_in_use): no answer yet, the effect unknown.
                payload = json.dumps({"error": {"code": "idempotency_key_in_use"}}).encode()
                self.send_response(409)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            if self.path.startswith("/huge"):
                payload = b"<html>" + b"x" * (5 * 1024 * 1024)
                self.send_response(502)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                return
            if secret is not None and signature != "ok":
                status, answer = 401, {"error": f"signature {signature}"}
            elif request["request_id"].endswith("7") and attempt == 1:
                status, answer = 503, {"error": "busy"}
            else:
                result = (request.get("attributes") or {}).get("answer", "purchased")
                status, answer = 200, {"result": result}
            payload = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    class Server(http.server.ThreadingHTTPServer):
        request_queue_size = 256  # the processor opens many connections at once

    server = Server(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"port={server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
