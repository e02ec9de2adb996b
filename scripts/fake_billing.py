#!/usr/bin/env python3
"""A stand-in billing service for the http controller in tests.

Answers POST with {"result": "purchased"} after --delay-ms (or with the result named in the
request's attributes.answer, for scripted stories), logs each request id it was called with (one per
line, flushed) to --log, and answers 503 to the first attempt of every request whose id ends in "7"
(so retries are exercised). Prints "port=N" once listening; stops on SIGTERM.
"""
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
    args = parser.parse_args()
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
            with lock:
                log.write(f"{request['request_id']} {attempt} {key}\n")
            time.sleep(args.delay_ms / 1000)
            if request["request_id"].endswith("7") and attempt == 1:
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
