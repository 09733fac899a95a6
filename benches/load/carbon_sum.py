"""A carbon plaintext receiver for the brubeck benchmarks: sums the values of every line whose
path starts with PREFIX and, on SIGTERM, writes the sum to OUT.

    python3 carbon_sum.py PORT PREFIX OUT
"""
import selectors
import signal
import socket
import sys

port, prefix, out = int(sys.argv[1]), sys.argv[2].encode(), sys.argv[3]
total = 0.0


def finish(*_):
    with open(out, "w") as f:
        f.write(f"{total}\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, finish)
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(16)
selector = selectors.DefaultSelector()
selector.register(listener, selectors.EVENT_READ)
pending = {}
while True:
    for key, _ in selector.select():
        if key.fileobj is listener:
            conn, _ = listener.accept()
            selector.register(conn, selectors.EVENT_READ)
            pending[conn] = b""
            continue
        conn = key.fileobj
        chunk = conn.recv(1 << 20)
        if not chunk:
            selector.unregister(conn)
            conn.close()
            del pending[conn]
            continue
        lines = (pending[conn] + chunk).split(b"\n")
        pending[conn] = lines.pop()
        for line in lines:
            if line.startswith(prefix):
                total += float(line.split(b" ", 2)[1])
