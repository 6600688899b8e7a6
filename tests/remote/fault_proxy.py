#!/usr/bin/env python3
"""A fault-injecting HTTP proxy for the remote-file tests: forwards GET and HEAD requests to an
upstream server (nginx, or an S3-compatible server) and spoils the answers the way broken
servers, middleboxes and replaced objects do, so that the client's checks are tested against
real bytes on a real socket.

    fault_proxy.py UPSTREAM_PORT FAULT [--after N] [--to URL] [--log FILE] [--tls CERT KEY]
                   [--query TEXT]

--to URL is where the redirect faults send a client (the request's path appended); --log FILE
appends each request's method, path and headers to FILE as one JSON line; --tls serves HTTPS
with that certificate and key; --query is the signature the `signed` fault asks for.

Prints the port it listens on (127.0.0.1) as its first line, then serves until killed. The
first N requests (default 0) pass untouched; from then on every GET gets FAULT:

    none      forward as is
    short     the body cut to half, Content-Length to match, Content-Range kept (a short body)
    long      16 bytes appended to the body, Content-Length to match (a long body)
    range     Content-Range shifted by one byte (other bytes than asked)
    whole     the Range header dropped upstream: 200 with the whole object instead of 206
    html      200 with an HTML error page, as a captive portal or a misrouted proxy answers
    etag      If-Match dropped upstream, the answer's ETag changed (the object was replaced)
    hang      the request read, then nothing sent until the client gives up
    hang-once the first GET after the N hangs as `hang` does; every later one passes untouched
    status500 503 with an HTML body (a failing server; the client retries, then fails)
    redirect  302 back to the same URL (a redirect loop)
    weak      every ETag sent weak (W/"..."), as servers that transform or cannot promise
              byte-identical answers do; a GET whose If-Match is weak gets 412 (RFC 9110
              13.1.1: If-Match compares strongly, so a weak tag never matches). Applies from
              the first request, whatever --after says.
    weak-etag as `weak`; after N requests the ETag also changes (the object was replaced)
    cut       the body broken off halfway (the connection closed, Content-Length unmet), once;
              every later GET passes untouched (a retry of the rest must succeed)
    cut-range the body broken off halfway once, as `cut`; the next GET (its retry) gets
              `range`, every later one passes (a retry answered with other bytes than it
              asked must be refused)
    redirect-to  302 to --to URL with the request's path
    echo403   403 with every request header echoed in the body, as servers that quote the
              request they refuse do (credentials must never reach a message from there)
    endless403  403 whose body never ends (chunks of text until the client hangs up): a
              refusal's body must be read only so far
    signed    a GET or HEAD whose query string lacks --query TEXT gets 403 with the request
              (its query included) echoed, as a store checking a pre-signed URL refuses; one
              that holds it is forwarded as is. Applies from the first request.
"""
import http.client
import json
import socketserver
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

UPSTREAM = int(sys.argv[1])
FAULT = sys.argv[2]



def option(name, default=None, n=1):
    if name not in sys.argv:
        return default
    i = sys.argv.index(name)
    return sys.argv[i + 1] if n == 1 else sys.argv[i + 1 : i + 1 + n]


AFTER = int(option("--after", "0"))
TO = option("--to")
LOG = option("--log")
TLS = option("--tls", n=2)
QUERY = option("--query")
count_lock = threading.Lock()
count = 0

HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def forward(self, drop=()):
        conn = http.client.HTTPConnection("127.0.0.1", UPSTREAM, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP and k.lower() not in drop}
        conn.request(self.command, self.path, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        return resp.status, [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP], body

    def send(self, status, headers, body):
        self.send_response_only(status)
        for k, v in headers:
            # A HEAD answer keeps the upstream's length (it has no body to measure).
            if k.lower() != "content-length" or self.command == "HEAD":
                self.send_header(k, v)
        if self.command != "HEAD":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def unsigned(self):
        """Whether the `signed` fault refuses this request (its query lacks the signature)."""
        query = self.path.split("?", 1)[1] if "?" in self.path else ""
        return FAULT == "signed" and QUERY not in query.split("&")

    def refuse(self):
        text = "".join(f"<{k}>{v}</{k}>" for k, v in self.headers.items())
        page = f"<Error><Code>AccessDenied</Code><Request>{self.path} {text}</Request></Error>"
        return self.send(403, [("Content-Type", "application/xml")], page.encode())

    def do_HEAD(self):
        if self.unsigned():
            return self.refuse()
        status, headers, body = self.forward()
        if FAULT in ("weak", "weak-etag"):
            headers = weaken(headers, replaced=False)
        self.send(status, headers, body)

    def do_GET(self):
        global count
        with count_lock:
            n = count
            count += 1
            if LOG:
                with open(LOG, "a") as f:
                    entry = {"method": self.command, "path": self.path, "headers": dict(self.headers.items())}
                    f.write(json.dumps(entry) + "\n")
        if self.unsigned():
            return self.refuse()
        fault = FAULT if n >= AFTER else "none"
        if fault in ("cut", "cut-range"):
            retry = fault == "cut-range" and n == AFTER + 1
            fault = "cut" if n == AFTER else "range" if retry else "none"
        if fault == "echo403":
            return self.refuse()
        if fault == "endless403":
            self.send_response_only(403)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b"access denied, and more text " * 512
            try:
                while True:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            except (BrokenPipeError, ConnectionResetError):
                return
        if fault == "redirect-to":
            return self.send(302, [("Location", TO + self.path)], b"")
        weak = FAULT in ("weak", "weak-etag")
        if weak and self.headers.get("If-Match", "").strip().startswith("W/"):
            return self.send(412, [("Content-Type", "text/plain")], b"precondition failed")
        if fault == "hang-once":
            fault = "hang" if n == AFTER else "none"
        if fault == "hang":
            time.sleep(3600)
            return
        if fault == "html":
            page = b"<html><head><title>Error</title></head><body>Service unavailable</body></html>"
            return self.send(200, [("Content-Type", "text/html")], page)
        if fault == "redirect":
            return self.send(302, [("Location", self.path)], b"")
        if fault == "status500":
            page = b"<html><body><h1>503 Service Unavailable</h1></body></html>"
            return self.send(503, [("Content-Type", "text/html")], page)
        drop = {"range"} if fault == "whole" else {"if-match"} if fault == "etag" else set()
        status, headers, body = self.forward(drop)
        if fault == "cut":
            # Every header as sent, then half the body, then the connection closed.
            self.send_response_only(status)
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if fault == "short":
            body = body[: len(body) // 2]
        elif fault == "long":
            body = body + b"\0" * 16
        elif fault == "range":
            headers = [(k, shift(v) if k.lower() == "content-range" else v) for k, v in headers]
        elif fault == "etag":
            headers = [(k, '"replaced-0"' if k.lower() == "etag" else v) for k, v in headers]
        if weak:
            headers = weaken(headers, replaced=fault == "weak-etag")
        self.send(status, headers, body)


def weaken(headers, replaced):
    """The ETag of `headers` made weak (and another one when `replaced`)."""
    def tag(v):
        return 'W/"replaced-0"' if replaced else v if v.startswith("W/") else "W/" + v
    return [(k, tag(v) if k.lower() == "etag" else v) for k, v in headers]


def shift(value):
    # "bytes a-b/n" -> "bytes (a+1)-(b+1)/n"
    unit, rest = value.split(" ", 1)
    span, total = rest.split("/")
    a, b = span.split("-")
    return f"{unit} {int(a) + 1}-{int(b) + 1}/{total}"


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    server = Server(("127.0.0.1", 0), Handler)
    if TLS:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(TLS[0], TLS[1])
        server.socket = context.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
