"""Evaluates every PromQL query of a Grafana dashboard through Prometheus's
HTTP API (PROM); fails if any returns no series or an error."""
import json
import os
import sys
import time
import urllib.parse
import urllib.request

prom = os.environ["PROM"]
dash = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
assert exprs, "the dashboard has no queries"


def query(expr):
    url = prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return body["data"]["result"]


# Wait until Prometheus has scraped Canopy a few times.
deadline = time.time() + 60
while time.time() < deadline:
    try:
        if query("count_over_time(canopy_ready[1m])") and float(query("count_over_time(canopy_ready[1m])")[0]["value"][1]) >= 3:
            break
    except Exception:
        pass
    time.sleep(1)

empty = []
for e in exprs:
    result = query(e)
    print(f"{len(result):3d} series  {e}")
    if not result:
        empty.append(e)
if empty:
    print(f"{len(empty)} of {len(exprs)} dashboard queries returned no series:", *empty, sep="\n  ")
    sys.exit(1)
print(f"all {len(exprs)} dashboard queries return series")
