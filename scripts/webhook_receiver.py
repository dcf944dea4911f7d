#!/usr/bin/env python3
"""A webhook receiver for the demo: listens on 127.0.0.1:PORT, answers 200 to every POST,
checks the X-Tide-Signature header against SECRET (HMAC-SHA256 of the body), and appends one
readable entry per request to LOG. Standard library only."""
import hashlib
import hmac
import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

PORT, SECRET, LOG = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
        signed = hmac.compare_digest(expected, self.headers.get("X-Tide-Signature", ""))
        try:
            text = json.loads(body).get("text", "")
        except ValueError:
            text = body.decode(errors="replace")
        with open(LOG, "a") as log:
            log.write(f"POST {self.path}  X-Tide-Event: {self.headers.get('X-Tide-Event')}  "
                      f"X-Tide-Delivery: {self.headers.get('X-Tide-Delivery')}  "
                      f"signature {'valid' if signed else 'INVALID'}\n")
            log.write("".join(f"    {line}\n" for line in text.splitlines()))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", PORT), Hook).serve_forever()
