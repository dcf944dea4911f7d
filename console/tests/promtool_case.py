"""Tests monitoring/'s Prometheus alert rules and Grafana panels against a recorded scrape of
pg_tide-console's /metrics, with promtool (called by the console tier, console/tests/browser.rs).

    promtool_case.py SCRAPE EXPECT_JSON RULES DASHBOARD OUT_DIR

SCRAPE: the exposition as recorded. EXPECT_JSON: {"as_recorded": [alert, ...],
"scheduler_stopped": [alert, ...]}, each alert {"alertname": ..., "labels": {...}}: the alerts
expected 30 minutes into each case; every other rule of RULES is expected not to fire.

The recording is taken as the state of minutes 0 to 30 (one sample a minute, the scrape being
minute 30): gauges hold their value; counters (and histogram series) were 0 until minute 20,
then hold theirs (so increase() sees them rise); timestamps are moved to promtool's clock,
whose minute 30 is the instant of the scrape, and pg_tide_last_tick_timestamp_seconds keeps
pace with it (the scheduler ticks). In "scheduler_stopped" the scheduler is gone from minute 20:
pg_tide_workers{kind="scheduler"} is 0 and the last tick stays at minute 20. A third case, with
no series at all, expects PgTideMetricsAbsent.

Each Grafana panel's queries become alert rules `count(<query>) > 0` and are expected to fire
in "as_recorded": each returns data. Annotations are left out of the rules under test (their
templates are checked by `promtool check rules` on the file itself).
"""

import json
import math
import subprocess
import sys
import time

import yaml
from prometheus_client.parser import text_string_to_metric_families

STEP = 60
MINUTES = 30
RISE = 20


def series_name(name, labels):
    if not labels:
        return name
    inner = ",".join('%s=%s' % (k, json.dumps(v)) for k, v in sorted(labels.items()))
    return "%s{%s}" % (name, inner)


def num(v):
    return repr(float(v))


def input_series(families, scrape_at, scheduler_stopped):
    out = []
    for family in families:
        for s in family.samples:
            v = s.value
            if math.isnan(v) or math.isinf(v):
                continue
            name = s.name
            if family.type in ("counter", "histogram"):
                values = "0+0x%d %s+0x%d" % (RISE - 1, num(v), MINUTES - RISE)
            elif name == "pg_tide_last_tick_timestamp_seconds":
                # Minute m of the case is promtool's m * 60 seconds; the scrape was minute 30.
                at = v - scrape_at + MINUTES * STEP
                start = at - MINUTES * STEP
                if scheduler_stopped:
                    values = "%s+%dx%d %s+0x%d" % (num(start), STEP, RISE, num(start + RISE * STEP), MINUTES - RISE - 1)
                else:
                    values = "%s+%dx%d" % (num(start), STEP, MINUTES)
            elif name.endswith("_timestamp_seconds"):
                values = "%s+0x%d" % (num(v - scrape_at + MINUTES * STEP), MINUTES)
            elif scheduler_stopped and name == "pg_tide_workers" and s.labels.get("kind") == "scheduler":
                values = "%s+0x%d 0+0x%d" % (num(v), RISE, MINUTES - RISE - 1)
            else:
                values = "%s+0x%d" % (num(v), MINUTES)
            out.append({"series": series_name(name, s.labels), "values": values})
    return out


def main():
    scrape_path, expect_json, rules_path, dashboard_path, out_dir = sys.argv[1:6]
    text = open(scrape_path).read()
    scrape_at = time.time()
    for line in text.splitlines():
        # The scrape's own instant, as the test recorded it (a comment the test adds).
        if line.startswith("# recorded_at "):
            scrape_at = float(line.split()[2])
    families = list(text_string_to_metric_families(text))
    expect = json.loads(expect_json)

    rules = yaml.safe_load(open(rules_path))
    names = []
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
            names.append(rule["alert"])
    panels = []
    dashboard = json.load(open(dashboard_path))
    for p in dashboard["panels"]:
        for t in p.get("targets", []):
            name = "Panel%d%s" % (p["id"], t["refId"])
            panels.append((name, p["title"], t["expr"]))
    rules["groups"].append({
        "name": "grafana_panels",
        "rules": [{"alert": n, "expr": "count(%s) > 0" % expr} for n, _, expr in panels],
    })
    under_test = out_dir + "/rules-under-test.yml"
    with open(under_test, "w") as f:
        yaml.safe_dump(rules, f, sort_keys=False)

    def alert_tests(expected, with_panels):
        tests = []
        by_name = {}
        for a in expected:
            by_name.setdefault(a["alertname"], []).append({"exp_labels": a["labels"]})
        for n in names:
            tests.append({"eval_time": "%dm" % MINUTES, "alertname": n, "exp_alerts": by_name.pop(n, [])})
        if by_name:
            sys.exit("expected alerts that no rule makes: %s" % sorted(by_name))
        if with_panels:
            for n, _, _ in panels:
                tests.append({"eval_time": "%dm" % MINUTES, "alertname": n, "exp_alerts": [{"exp_labels": {}}]})
        return tests

    cases = {
        "rule_files": [under_test],
        "evaluation_interval": "1m",
        "tests": [
            {"name": "as_recorded", "interval": "1m",
             "input_series": input_series(families, scrape_at, False),
             "alert_rule_test": alert_tests(expect["as_recorded"], True)},
            {"name": "scheduler_stopped", "interval": "1m",
             "input_series": input_series(families, scrape_at, True),
             "alert_rule_test": alert_tests(expect["scheduler_stopped"], False)},
            {"name": "no_metrics", "interval": "1m",
             "input_series": [],
             "alert_rule_test": alert_tests([{"alertname": "PgTideMetricsAbsent", "labels": {"severity": "critical"}}], False)},
        ],
    }
    test_path = out_dir + "/rules-test.yml"
    with open(test_path, "w") as f:
        yaml.safe_dump(cases, f, sort_keys=False)
    for args in (["promtool", "check", "rules", rules_path], ["promtool", "check", "rules", under_test],
                 ["promtool", "test", "rules", test_path]):
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            print("$ " + " ".join(args))
            print(r.stdout + r.stderr)
            print("panels: " + "; ".join("%s = %s: %s" % (n, title, expr) for n, title, expr in panels))
            sys.exit(1)
    print("%d rules and %d panel queries tested in 3 cases" % (len(names), len(panels)))


if __name__ == "__main__":
    main()
