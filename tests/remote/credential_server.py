#!/usr/bin/env python3
"""Stand-ins for the places AWS programs get temporary credentials from, on loopback, for the
remote-file tests: each hands out the key pair it is given with a fresh session token and an
expiry, and refuses a caller that does not prove itself the way the real service asks.

    credential_server.py ACCESS_KEY SECRET_KEY --log FILE [--ttl SECONDS] [--tls CERT KEY]
                         [--pod-token TEXT] [--web-token TEXT]

    PUT /latest/api/token                          instance metadata (IMDSv2): a session token,
                                                   given X-aws-ec2-metadata-token-ttl-seconds
    GET /latest/meta-data/iam/security-credentials/        the role's name     } with the
    GET /latest/meta-data/iam/security-credentials/ROLE    the role's creds    } session token
    GET /pod-credentials                           container credentials (the EKS Pod Identity
                                                   agent, ECS's full URI): JSON, given
                                                   Authorization equal to --pod-token
    POST /?Action=AssumeRoleWithWebIdentity&...    STS: XML, given WebIdentityToken equal to
                                                   --web-token and a RoleArn

Credentials expire --ttl seconds after they are handed out (default 240: under the five minutes
before expiry at which clients fetch again, so that a client asks again on its next request).
Each hand-out appends `SOURCE N` to --log FILE (N counting from 1 per source). Prints the port
it listens on (127.0.0.1) as its first line, then serves until killed.
"""
import datetime
import json
import socketserver
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs, urlsplit

ACCESS_KEY, SECRET_KEY = sys.argv[1], sys.argv[2]


def option(name, n=1, default=None):
    if name not in sys.argv:
        return default
    i = sys.argv.index(name)
    return sys.argv[i + 1] if n == 1 else sys.argv[i + 1 : i + 1 + n]


LOG = option("--log")
TTL = int(option("--ttl", default="240"))
TLS = option("--tls", n=2)
POD_TOKEN = option("--pod-token")
WEB_TOKEN = option("--web-token")
ROLE = "safetensors-test-role"
IMDS_TOKEN = "imds-session-7f3a"
counts = {}
lock = threading.Lock()


def issue(source):
    with lock:
        counts[source] = counts.get(source, 0) + 1
        n = counts[source]
        with open(LOG, "a") as f:
            f.write(f"{source} {n}\n")
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=TTL)
    return n, expiry.strftime("%Y-%m-%dT%H:%M:%SZ")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, kind="text/plain"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def creds_json(self, source):
        n, expiry = issue(source)
        body = {
            "Code": "Success",
            "Type": "AWS-HMAC",
            "AccessKeyId": ACCESS_KEY,
            "SecretAccessKey": SECRET_KEY,
            "Token": f"{source}-session-{n}",
            "Expiration": expiry,
        }
        self.answer(200, json.dumps(body), "application/json")

    def do_PUT(self):
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            return self.answer(200, IMDS_TOKEN)
        self.answer(400, "bad token request")

    def do_GET(self):
        path = urlsplit(self.path).path
        base = "/latest/meta-data/iam/security-credentials/"
        if path.startswith(base):
            if self.headers.get("X-aws-ec2-metadata-token") != IMDS_TOKEN:
                return self.answer(401, "no session token")
            if path == base:
                return self.answer(200, ROLE)
            if path == base + ROLE:
                return self.creds_json("imds")
            return self.answer(404, "no such role")
        if path == "/pod-credentials":
            if POD_TOKEN is None or self.headers.get("Authorization") != POD_TOKEN:
                return self.answer(401, "unauthorized")
            return self.creds_json("pod")
        self.answer(404, "not found")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode() if length else ""
        query = parse_qs(urlsplit(self.path).query)
        query.update(parse_qs(body))
        one = lambda k: (query.get(k) or [None])[0]
        if one("Action") != "AssumeRoleWithWebIdentity" or not one("RoleArn"):
            return self.answer(400, "<Error><Code>InvalidAction</Code></Error>", "text/xml")
        if WEB_TOKEN is None or one("WebIdentityToken") != WEB_TOKEN:
            return self.answer(403, "<Error><Code>InvalidIdentityToken</Code></Error>", "text/xml")
        n, expiry = issue("sts")
        xml = (
            '<AssumeRoleWithWebIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
            "<AssumeRoleWithWebIdentityResult><Credentials>"
            f"<SessionToken>sts-session-{n}</SessionToken>"
            f"<SecretAccessKey>{SECRET_KEY}</SecretAccessKey>"
            f"<Expiration>{expiry}</Expiration>"
            f"<AccessKeyId>{ACCESS_KEY}</AccessKeyId>"
            "</Credentials></AssumeRoleWithWebIdentityResult>"
            "</AssumeRoleWithWebIdentityResponse>"
        )
        self.answer(200, xml, "text/xml")


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    allow_reuse_address = True


server = Server(("127.0.0.1", 0), Handler)
if TLS:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(TLS[0], TLS[1])
    server.socket = context.wrap_socket(server.socket, server_side=True)
print(server.server_address[1], flush=True)
server.serve_forever()
