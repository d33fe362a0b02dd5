"""A pass-through HTTP proxy that logs each request a client sends to tinyvllm (stdlib only).

    python logging_proxy.py LISTEN_PORT UPSTREAM_URL LOG_FILE

Each request is one JSON line in LOG_FILE: method, path, status, and the request body's top-level keys
(plus `options` keys, `stream`, `model`), so a peer client's traffic can be read without tinyvllm's own
access log. Responses, streamed ones included, are relayed chunk by chunk as they arrive.
"""
import http.client
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection",
              "content-length", "host"}
_log_lock = threading.Lock()


def body_summary(body: bytes) -> dict:
    try:
        doc = json.loads(body) if body else None
    except ValueError:
        return {"body_bytes": len(body)}
    if not isinstance(doc, dict):
        return {"body_bytes": len(body)}
    summary = {"keys": sorted(doc)}
    for key in ("model", "stream", "max_tokens", "max_completion_tokens", "format", "keep_alive"):
        if key in doc:
            summary[key] = doc[key]
    if isinstance(doc.get("options"), dict):
        summary["options"] = doc["options"]
    if isinstance(doc.get("stream_options"), dict):
        summary["stream_options"] = doc["stream_options"]
    return summary


class Proxy(BaseHTTPRequestHandler):
    upstream = urlsplit("http://127.0.0.1:8000")
    log_path = "requests.jsonl"
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def relay(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        conn = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
        conn.request(self.command, self.path, body=body or None, headers=headers)
        reply = conn.getresponse()
        with _log_lock, open(self.log_path, "a") as log:
            log.write(json.dumps({"method": self.command, "path": self.path, "status": reply.status,
                                  **body_summary(body)}) + "\n")
        self.send_response(reply.status)
        for key, value in reply.getheaders():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        if self.command == "HEAD":
            self.send_header("Content-Length", reply.getheader("Content-Length", "0"))
            self.end_headers()
            return conn.close()
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while chunk := reply.read1(65536):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        conn.close()

    do_GET = do_POST = do_DELETE = do_HEAD = do_OPTIONS = do_PUT = relay


def main():
    port, upstream, log_path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    Proxy.upstream, Proxy.log_path = urlsplit(upstream), log_path
    ThreadingHTTPServer(("127.0.0.1", port), Proxy).serve_forever()


if __name__ == "__main__":
    main()
