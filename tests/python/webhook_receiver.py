"""A webhook receiver that checks every delivery with the `standardwebhooks`
package (the reference implementation of the scheme OpenAI signs its
webhooks with) and logs it.

Usage: webhook_receiver.py SECRET PORT_FILE LOG FAIL_FIRST [PORT]

Listens on 127.0.0.1 (PORT, else a free port; written to PORT_FILE), answers 500 to the
first FAIL_FIRST attempts of each event and 200 after, and appends one JSON
line per attempt to LOG: the event id, its body, whether the signature
verified, and the status answered. Runs until killed.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

secret, port_file, log_path, fail_first = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
port = int(sys.argv[5]) if len(sys.argv) > 5 else 0
webhook = Webhook(secret)
attempts = {}


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            event = webhook.verify(body, headers)
            verified = True
        except WebhookVerificationError as e:
            event, verified = {"error": str(e)}, False
        event_id = headers.get("webhook-id", "")
        attempts[event_id] = attempts.get(event_id, 0) + 1
        status = 500 if attempts[event_id] <= fail_first else 200
        with open(log_path, "a") as log:
            log.write(json.dumps({"id": event_id, "attempt": attempts[event_id], "verified": verified,
                                  "event": event, "status": status}) + "\n")
        self.send_response(status)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", port), Receiver)
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
import os  # noqa: E402
os.replace(port_file + ".tmp", port_file)
server.serve_forever()
