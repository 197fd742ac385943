"""Running `aiayn serve`: load a model directory (or an export), listen, serve until SIGTERM,
drain, and count what was accepted and answered."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
from collections.abc import Callable
from pathlib import Path

from fastapi import FastAPI

from aiayn.classify.classifier import Classifier
from aiayn.errors import AiaynError
from aiayn.generate.generator import Generator
from aiayn.runtime.gc_pauses import freeze_startup
from aiayn.serve.app import create_app
from aiayn.serve.handlers import ServeOptions
from aiayn.store.directory import ModelDir
from aiayn.translate.translator import Translator

log = logging.getLogger(__name__)


def load_any(
    opened: ModelDir, device: str, dtype: str, threads: int
) -> Translator | Generator | Classifier:
    """The translator of an aiayn model directory, or of an `aiayn export` directory
    (CTranslate2 or ONNX Runtime: the same API, the engine's own search; nothing to trace), the
    generator of a language model's directory (a DecoderLM: served at /v1/generate), or the
    classifier of a classifier's directory or of its ONNX export (an EncoderClassifier: served
    at /v1/classify)."""
    from aiayn.interop.cls_engines import load_classifier
    from aiayn.interop.engines import load_translator

    if not opened.is_export and opened.architecture == "DecoderLM":
        return Generator.load(opened, device=device, dtype=dtype)
    if opened.architecture == "EncoderClassifier":
        return load_classifier(opened, device=device, dtype=dtype, threads=threads)
    if opened.is_export:
        return load_translator(opened, device=device, dtype=dtype, threads=threads)
    return Translator.load(opened, device=device, dtype=dtype)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (port 0 = any free port): a clear error if taken."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: without it, a response written in two parts waits
        # for the client's delayed ACK (~40 ms on Linux) on every keep-alive request.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(addr)
    except OSError as e:
        raise AiaynError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.listen(2048)
    return sock


def serve(
    model_dir: Path,
    opts: ServeOptions,
    *,
    device: str = "auto",
    dtype: str = "auto",
    threads: int = 0,
    announce: Callable[[str], None] = print,
) -> dict[str, int]:
    """Load the model and serve until SIGTERM or Ctrl-C; a SIGTERM drains and returns the
    count of requests accepted and answered (equal unless a client went away mid-answer).

    On SIGTERM uvicorn stops accepting connections, answers every request it has accepted,
    then runs the app's shutdown (the model worker answers what is queued and stops).
    """
    if not is_loopback(opts.host) and not opts.api_key:
        raise AiaynError(
            f"--host {opts.host} is reachable from other machines: give --api-key "
            "KEY (or set AIAYN_API_KEY), or serve on 127.0.0.1"
        )
    # The port first: a taken one is said at once, not after the model has loaded, and never
    # while the model worker runs (a process leaving with it mid-calibration aborted, 134).
    sock = listen(opts.host, opts.port)
    app = None
    try:
        opened = ModelDir.open(model_dir)  # the one reading of the directory's description
        model = load_any(opened, device, dtype, threads)
        app = create_app(model, opened, opts)
        where = model.precision.device if isinstance(model, Classifier) else model.device
        return _run(app, sock, model_dir, where, opts, announce)
    finally:
        sock.close()
        if app is not None:  # the worker stops (done already after a drain: the app's lifespan)
            app.state.server.batcher.close(timeout_s=5.0)


def _run(
    app: FastAPI,
    sock: socket.socket,
    model_dir: Path,
    device: object,
    opts: ServeOptions,
    announce: Callable[[str], None],
) -> dict[str, int]:
    """uvicorn on `sock` until SIGTERM or Ctrl-C; the counts of requests accepted and answered."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    # uvicorn's own access log would write query strings (and so `?api_key=`): `Accounting`
    # writes one without them.
    # limit_concurrency: past it, a new connection gets a 503 at once instead of a task.
    config = uvicorn.Config(
        app,
        log_level="info",
        access_log=False,
        timeout_keep_alive=5,
        limit_concurrency=opts.max_connections,
        server_header=False,
    )
    if opts.access_log:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    server = uvicorn.Server(config)
    # What is loaded by now lives as long as the process: frozen, it is not traversed by the
    # full collections that would otherwise stop every request for ~150 ms (gc_pauses).
    log.info("froze %d objects out of garbage collection", freeze_startup())
    where = f"[{host}]" if ":" in host else host
    announce(f"aiayn serve: {model_dir} ({device}) on http://{where}:{port}/")
    # uvicorn re-raises the SIGTERM it handled once it has drained; a handler that does
    # nothing turns that into a normal return, so the process exits 0.
    previous = signal.signal(signal.SIGTERM, lambda _sig, _frame: None)
    try:
        server.run(sockets=[sock])
    finally:
        signal.signal(signal.SIGTERM, previous)
    return {"accepted": app.state.server.accepted, "answered": app.state.server.answered}
