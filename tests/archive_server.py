"""A loopback HTTP server for download tests: serves byte strings, honours ``Range: bytes=N-``,
and can fail on purpose (an HTTP status, a web page instead of the file, a connection dropped
after N bytes, a connection that stalls after N bytes, an answer that never ends). Never reaches
beyond 127.0.0.1."""

from __future__ import annotations

import sys
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


#: where an "endless" answer gives up (far more than any test archive), so a download that does not stop fills no disk
ENDLESS_CAP = 64 << 20
#: how long a stalled connection stays silent before the server closes it
STALL_S = 10.0


@dataclass
class Behaviour:
    files: dict[str, bytes] = field(default_factory=dict)
    status: dict[str, int] = field(default_factory=dict)  # path -> HTTP error to answer
    html: set[str] = field(default_factory=set)  # paths answered with a web page
    drop_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before the connection drops
    stall_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent before it stops sending
    endless: dict[str, bool] = field(default_factory=dict)  # path -> the file then zeros without end (True: with
    #                                                          the file's Content-Length, False: no length at all)
    sent: dict[str, int] = field(default_factory=dict)  # path -> bytes of body the server managed to send
    ignore_range: bool = False
    log: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header) per request
    stop: threading.Event = field(default_factory=threading.Event)  # set when the server stops


def _handler(behaviour: Behaviour):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output clean
            pass

        def do_GET(self):
            path = self.path
            behaviour.log.append((path, self.headers.get("Range")))
            if path in behaviour.status:
                self.send_response(behaviour.status[path])
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if path in behaviour.html:
                page = b"<html><body>Google Drive - Quota exceeded</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            body = behaviour.files.get(path)
            if body is None:
                self.send_error(404)
                return
            if path in behaviour.endless:
                self._endless(path, body, behaviour.endless[path])
                return
            start = 0
            ranged = self.headers.get("Range", "")
            if ranged.startswith("bytes=") and not behaviour.ignore_range:
                start = int(ranged[len("bytes="):].split("-")[0])
                if start >= len(body):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(body)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
            else:
                self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body) - start))
            self.send_header("ETag", '"v1"')
            self.end_headers()
            payload = body[start:]
            if path in behaviour.stall_after:
                self.wfile.write(payload[: behaviour.stall_after.pop(path)])
                self.wfile.flush()
                behaviour.stop.wait(STALL_S)  # silent: the client times out (or is interrupted) first
                self.close_connection = True
                return
            if path in behaviour.drop_after:
                payload = payload[: behaviour.drop_after.pop(path)]
                self.wfile.write(payload)
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(payload)

        def _endless(self, path: str, body: bytes, with_length: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            if with_length:
                self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            sent, block = 0, bytes(64 << 10)
            try:
                self.wfile.write(body)
                sent = len(body)
                while sent < ENDLESS_CAP and not behaviour.stop.is_set():
                    self.wfile.write(block)
                    sent += len(block)
            except OSError:  # the client hung up: what it did not read is not "sent" any further
                pass
            finally:
                behaviour.sent[path] = sent

    return Handler


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client hanging up mid-answer is a test's point
            super().handle_error(request, client_address)


class ArchiveServer:
    """``with ArchiveServer() as server:`` serves ``server.behaviour.files`` at ``server.url(path)``."""

    def __init__(self):
        self.behaviour = Behaviour()
        self.httpd = _Server(("127.0.0.1", 0), _handler(self.behaviour))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}{path}"

    def stop(self) -> None:
        self.behaviour.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "ArchiveServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.thread.is_alive():
            self.stop()
