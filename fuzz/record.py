#!/usr/bin/env python3
"""Records the Kafka requests real clients send, as fuzz seeds.

    fuzz/record.py LISTEN_PORT BROKER_HOST:PORT OUT_DIR

A TCP proxy: every connection to LISTEN_PORT is forwarded to the broker,
and each request frame a client sends is written to OUT_DIR as one file
(the frame without its 4-byte length: header and body, which is what the
`request` fuzz target takes), named `<api key>-v<version>-<sha1>`. Start
the broker with `--advertised-listener 127.0.0.1:LISTEN_PORT` so clients
come back through the proxy after bootstrapping. `fuzz/record-corpus.sh`
runs the compatibility clients (kafka-python, confluent-kafka/librdkafka,
kafkajs, kcat) through it.
"""
import hashlib
import os
import socket
import sys
import threading


def pump(src, dst, record_to=None):
    buf = b""
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            dst.sendall(data)
            if record_to is None:
                continue
            buf += data
            while len(buf) >= 4:
                n = int.from_bytes(buf[:4], "big", signed=True)
                if n < 0 or len(buf) < 4 + n:
                    break
                frame, buf = buf[4 : 4 + n], buf[4 + n :]
                if len(frame) >= 4:
                    key = int.from_bytes(frame[0:2], "big", signed=True)
                    ver = int.from_bytes(frame[2:4], "big", signed=True)
                    name = f"{key}-v{ver}-{hashlib.sha1(frame).hexdigest()[:16]}"
                    with open(os.path.join(record_to, name), "wb") as f:
                        f.write(frame)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def main():
    port, upstream, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    host, uport = upstream.rsplit(":", 1)
    os.makedirs(out, exist_ok=True)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(128)
    while True:
        c, _ = ls.accept()
        b = socket.create_connection((host, int(uport)))
        threading.Thread(target=pump, args=(c, b, out), daemon=True).start()
        threading.Thread(target=pump, args=(b, c), daemon=True).start()


if __name__ == "__main__":
    main()
