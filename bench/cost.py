"""Prices what `cost::cost` (Hookledger) and `bench/powertools/cost.py` (the
Powertools-Python pattern) measured, with `bench/prices.toml`, and prints the
bill per million unique events: each line item, per contract and for the mix,
at 1 M and 10 M events a month, x86 as deployed and arm64 beside it, the
default and the lean configuration, the billed duration's sensitivity to the
AWS latency assumed (±50 %), the monthly fixed cost, and the peers' list
prices. Every assumption it uses is printed first.

Usage: cost.py HOOKLEDGER_JSON POWERTOOLS_JSON PRICES_TOML TEMPLATE [--markdown]
"""

import json
import math
import os
import sys
import tomllib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "infra"))

# ------------------------------------------------------------- assumptions

DUPLICATES = 0.10  # of events, delivered twice by the provider
RETRIES = 0.05  # of events, whose work message is delivered again
LARGE = 0.01  # of events, a 64 KiB body (the mix only)
# Per-request latency of each AWS service as the function waits on it (ms).
LATENCY_MS = {"dynamodb": 6.0, "sqs": 8.0, "sns": 10.0, "s3": 15.0, "events": 10.0}
# The subscription contract's projection fetches the subscription from Stripe.
PROVIDER_API_MS = 150.0
# Lambda: a full vCPU at 1,769 MB, the share linear below it.
FULL_VCPU_MB = 1769
# The SQS event source's long polls: 5 pollers, a 20 s poll each when idle.
IDLE_POLLS_PER_MONTH = 5 * 3 * 60 * 24 * 30
# EMF metric documents: measured per invocation (the flows' `emf_bytes`, one
# message per processor invocation there); a processor invocation of a batch
# flushes one document, so its bytes are shared by the batch's messages.
# The Python runtime's own lines per invocation (START, END, REPORT), which
# the pattern keeps (Hookledger's JSON logs at SystemLogLevel WARN drop them).
PLATFORM_LOG_BYTES = 250
RECONCILER_RUNS = 12 * 24 * 30  # rate(5 minutes)
RECONCILER_RUN = {"cpu_ms": 10.0, "dynamodb": 8, "read_units": 8.0}  # an idle run (golden ReconcilerIdle: 8 queries)
# A finished record's due entry stays in the index; the reconciler's records
# phase reads it in every run that meets it: those with it in the look-ahead
# (300 s) or within the cursor's settle (120 s), the one that passes it, and
# the hourly rewind (15 min of entries read again): 1 + 420/300 + 900/3600.
RECONCILER_READS_PER_ENTRY = 1 + (300 + 120) / 300 + 900 / 3600
INDEX_BYTES = 0.0  # the due index's bytes per event (measured: `index_bytes_per_event`)
PLACES_UNITS_PER_RUN = 0.0  # write units of the places item per loaded run (measured)
LOADED_RUN_READ_UNITS = 0.0  # read units of a run that reads every shard, finding nothing (measured)
LOADED_RUN_SHARDS = 16  # the shards it was measured at
CUSTOM_METRICS = 52  # metric names the functions emit (one dimension set each)
RETENTION_DAYS = 30
SECONDS_PER_MONTH = 30 * 24 * 3600
VOLUMES = (1_000_000, 10_000_000)
CONFIGS = {
    "default": {"ingress": "HttpApi", "tracing": "PassThrough", "intake_mb": 256, "processor_mb": 256},
    "lean": {"ingress": "FunctionUrl", "tracing": "PassThrough", "intake_mb": 128, "processor_mb": 256},
    "as before (Tracing Active)": {"ingress": "HttpApi", "tracing": "Active", "intake_mb": 256, "processor_mb": 256},
}
CONTRACTS = ("payment", "seats_4k", "inventory", "subscription")


def load(path):
    return json.load(open(path))


def price(p, name, quantity):
    e = p[name]
    return e["price"] * quantity / e["per"]


def flow(d, name, contract):
    return d["flows"].get(f"{name}/{contract}")


def weights(contract, system):
    """(flow, weight per unique event) of a contract, or of the mix."""
    dup_proc = "processor_duplicate" if system == "powertools" else None
    def of(c, share, new="intake_new", proc="processor"):
        w = [(new, c, share), (proc, c, share), ("intake_duplicate", c, share * DUPLICATES),
             ("processor_redelivery", c, share * RETRIES)]
        if dup_proc:
            w.append((dup_proc, c, share * DUPLICATES))
        return w
    if contract != "mix":
        return of(contract, 1.0)
    out = []
    for c in CONTRACTS:
        out += of(c, (1 - LARGE) / len(CONTRACTS))
    return out + of("large", LARGE, "intake_large", "processor_large")


def service_latency(f):
    ms = 0.0
    for op, n in f["by_operation"].items():
        ms += n * LATENCY_MS.get(op.split(":")[0], 8.0)
    return ms


def bill(d, system, contract, cfg, volume, arch, latency_scale=1.0):
    """Line items ($) for `volume` unique events in a month."""
    p = PRICES
    items = {}
    intake_inv = proc_msgs = 0.0
    gb_s = 0.0
    units = {"wcu": 0.0, "rcu": 0.0, "sqs": 0.0, "sns": 0.0, "s3_put": 0.0, "s3_get": 0.0, "log": 0.0}
    rate = volume / SECONDS_PER_MONTH
    batch = max(1.0, min(10.0, rate * 1.0))  # BatchSize 10, batching window 1 s
    for name, c, w in weights(contract, system):
        f = flow(d, name, c)
        if f is None:
            continue
        is_intake = name.startswith("intake")
        mb = cfg["intake_mb"] if is_intake else cfg["processor_mb"]
        wall = f["cpu_ms"] * max(1.0, FULL_VCPU_MB / mb) + service_latency(f) * latency_scale
        if c == "subscription" and name == "processor":
            wall += PROVIDER_API_MS * latency_scale
        gb_s += w * volume * (mb / 1024) * wall / 1000
        if is_intake:
            intake_inv += w * volume
        else:
            proc_msgs += w * volume
        units["wcu"] += w * volume * f["write_units"]
        units["rcu"] += w * volume * f["read_units"]
        units["sqs"] += w * volume * f["sqs_requests"]
        units["sns"] += w * volume * f["sns_requests"]
        units["s3_put"] += w * volume * f["s3_put_requests"]
        units["s3_get"] += w * volume * f["s3_get_requests"]
        if system == "powertools":
            extra = PLATFORM_LOG_BYTES
        else:
            extra = f["emf_bytes"] if is_intake else f["emf_bytes"] / batch
        units["log"] += w * volume * (f["log_bytes"] + extra)
    if system != "powertools" and "reconciler" in d:
        # Each unique event's due entry, read by the reconciler as it passes.
        units["rcu"] += volume * RECONCILER_READS_PER_ENTRY * d["reconciler"]["read_units_per_entry_per_run"]
    proc_inv = proc_msgs / batch
    # The event source's receive and delete per batch.
    units["sqs"] += 2 * proc_inv
    ingress = cfg["ingress"]
    items["ingress (HTTP API; function URL: none)"] = (
        price(p, "apigw_http_requests", intake_inv) if ingress == "HttpApi" else price(p, "function_url_requests", intake_inv))
    items["Lambda requests"] = price(p, "lambda_requests", intake_inv + proc_inv)
    items["Lambda GB-s"] = price(p, f"lambda_gb_second_{arch}", gb_s)
    items["DynamoDB writes"] = price(p, "dynamodb_write_request_units", units["wcu"])
    items["DynamoDB reads"] = price(p, "dynamodb_read_request_units", units["rcu"])
    items["SQS"] = price(p, "sqs_standard_requests", units["sqs"])
    items["SNS"] = price(p, "sns_publishes", units["sns"])
    items["S3"] = price(p, "s3_put_requests", units["s3_put"]) + price(p, "s3_get_requests", units["s3_get"])
    items["CloudWatch Logs"] = price(p, "cloudwatch_logs_ingestion", units["log"] / 1e9)
    if cfg["tracing"] == "Active":
        # Default sampling: the first request each second, 5 % of the rest, per traced entry point.
        def traced(r):
            return (min(r, 1.0) + 0.05 * max(r - 1.0, 0.0)) * SECONDS_PER_MONTH
        items["X-Ray"] = price(p, "xray_traces_recorded", traced(intake_inv / SECONDS_PER_MONTH) + traced(proc_inv / SECONDS_PER_MONTH))
    else:
        items["X-Ray"] = 0.0
    items["KMS"] = 0.0  # requests: the alarm topic's, a handful a month (the key is in the fixed cost)
    return items, {"intake_invocations": intake_inv, "processor_invocations": proc_inv, "gb_s": gb_s, **units}


def fixed(cfg, volume, stored_bytes, system):
    """The monthly fixed cost ($) of a configuration, by line."""
    p = PRICES
    if system == "powertools":
        # Its idempotency records: the function's result for an hour.
        storage_gb = volume * 300 / 1e9 * (1 / 24 / 30)
        return {"DynamoDB storage": price(p, "dynamodb_storage", storage_gb)}
    from check_template import translate

    res, _ = translate(TEMPLATE, {"Ingress": cfg["ingress"], "Tracing": cfg["tracing"], "EndpointsConfig": "{}"})
    # An alarm is billed per metric it reads: a metric-math alarm per
    # metric (`MetricStat`) of its expression.
    alarms = sum(
        max(1, sum(1 for m in r.get("Properties", {}).get("Metrics", []) if "MetricStat" in m))
        for r in res.values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    )
    keys = sum(1 for r in res.values() if r["Type"] == "AWS::KMS::Key")
    storage_gb = volume * stored_bytes * (RETENTION_DAYS / 30) / 1e9
    # The due index's entries the records keep until they expire (no PITR on
    # a global secondary index).
    index_gb = volume * INDEX_BYTES * (RETENTION_DAYS / 30) / 1e9
    # A loaded run writes the records' places: measured at the bench's 16
    # shards, the item grows with the shards (80 by default).
    places_units = RECONCILER_RUNS * PLACES_UNITS_PER_RUN * 80 / 16
    # With traffic every run reads every shard (5 queries a shard, and the
    # places): measured on an empty table at the bench's shards, scaled to 80.
    loaded_reads = RECONCILER_RUNS * LOADED_RUN_READ_UNITS * 80 / LOADED_RUN_SHARDS
    run_gb_s = RECONCILER_RUNS * 0.25 * (RECONCILER_RUN["cpu_ms"] * FULL_VCPU_MB / 256 + RECONCILER_RUN["dynamodb"] * LATENCY_MS["dynamodb"]) / 1000
    return {
        f"CloudWatch alarms ({alarms})": price(p, "cloudwatch_alarms", alarms),
        f"custom metrics ({CUSTOM_METRICS})": price(p, "cloudwatch_metrics", CUSTOM_METRICS),
        f"KMS keys ({keys})": price(p, "kms_key", keys),
        "SQS idle polls": price(p, "sqs_standard_requests", IDLE_POLLS_PER_MONTH),
        "reconciler runs (every 5 min, idle)": price(p, "lambda_requests", RECONCILER_RUNS)
        + price(p, "lambda_gb_second_x86", run_gb_s)
        + price(p, "dynamodb_read_request_units", RECONCILER_RUNS * RECONCILER_RUN["read_units"]),
        "the records' places (runs at load)": price(p, "dynamodb_write_request_units", places_units),
        "every shard read by each run at load": price(p, "dynamodb_read_request_units", loaded_reads),
        f"DynamoDB storage at {RETENTION_DAYS} days": price(p, "dynamodb_storage", storage_gb),
        f"the due index's kept entries at {RETENTION_DAYS} days": price(p, "dynamodb_storage", index_gb),
        "PITR": price(p, "dynamodb_pitr", storage_gb),
    }


def money(x):
    return f"${x:,.2f}"


def table(rows, head):
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main():
    global PRICES, TEMPLATE, INDEX_BYTES, PLACES_UNITS_PER_RUN, LOADED_RUN_READ_UNITS, LOADED_RUN_SHARDS
    hook, pt = load(sys.argv[1]), load(sys.argv[2])
    INDEX_BYTES = hook.get("index_bytes_per_event", 0.0)
    PLACES_UNITS_PER_RUN = hook.get("reconciler", {}).get("write_units_per_run", 0.0)
    LOADED_RUN_READ_UNITS = hook.get("reconciler", {}).get("read_units_per_run_empty", 0.0)
    LOADED_RUN_SHARDS = hook.get("reconciler", {}).get("shards", 16)
    PRICES = tomllib.load(open(sys.argv[3], "rb"))
    TEMPLATE = sys.argv[4]
    stored = hook["stored_bytes_per_event"]
    print("## Assumptions\n")
    print(f"- {hook['events_per_contract']} events per contract measured ({hook['build']} build); "
          f"per million unique events: {1 + DUPLICATES:.2f} M deliveries ({DUPLICATES:.0%} duplicates), "
          f"{RETRIES:.0%} of work messages delivered again, the mix {LARGE:.0%} 64 KiB bodies; us-east-1, free tiers excluded.")
    print(f"- Billed duration = own CPU time (measured on one core) x {FULL_VCPU_MB}/memory MB (Lambda's CPU share) "
          f"+ AWS latency per request {LATENCY_MS} ms (+{PROVIDER_API_MS:.0f} ms for the subscription's Stripe fetch); "
          "sensitivity: the latency at 50 % and 150 %.")
    print(f"- Processor batches: min(10, events per second) messages (BatchSize 10, a 1 s window); "
          f"the event source's receive and delete per batch; {IDLE_POLLS_PER_MONTH:,} idle long polls a month.")
    print("- Logs: the measured JSON lines (INFO) + the EMF document each invocation flushes (measured; "
          "a processor batch shares one); "
          f"{CUSTOM_METRICS} custom metrics; storage: {stored:,.0f} bytes per event (+{INDEX_BYTES:,.0f} in the due index) for {RETENTION_DAYS} days, with PITR.")
    rec = hook.get("reconciler")
    if rec:
        print(f"- The reconciler at load: each event's due entry read {RECONCILER_READS_PER_ENTRY:.2f} times "
              f"(the look-ahead and the cursor's settle, the run that passes it, the hourly rewind) at "
              f"{rec['read_units_per_entry_per_run']:.3f} read units a read (measured over {rec['entries']} entries); "
              f"the places kept: {rec['write_units_per_run']:.1f} write units a run at the measured shards.")
    print("- X-Ray (Tracing Active): the default sampling rule, the first request each second and 5 % of the rest, per entry point.")
    print(f"- Powertools-Python: its own CPU time in this process, the same latency model, 256 MB, "
          f"{PLATFORM_LOG_BYTES} bytes of the runtime's own log lines per invocation and none of its own.\n")
    print("Prices (bench/prices.toml):\n")
    print(table([(k, f"{v['price']} per {v['per']:,}", v["unit"], v["source"], v["read"]) for k, v in PRICES.items()],
                ["entry", "price", "unit", "source", "read"]))

    for volume in VOLUMES:
        print(f"\n## {volume // 1_000_000} M unique events a month: $ per million unique events\n")
        head = ["contract"] + [f"{name} x86" for name in CONFIGS] + ["default arm64", "lean arm64", "Powertools-Python x86"]
        rows = []
        for contract in CONTRACTS + ("mix",):
            row = [contract]
            for cfg in CONFIGS.values():
                items, _ = bill(hook, "hookledger", contract, cfg, volume, "x86")
                row.append(money(sum(items.values()) / (volume / 1e6)))
            for name in ("default", "lean"):
                items, _ = bill(hook, "hookledger", contract, CONFIGS[name], volume, "arm64")
                row.append(money(sum(items.values()) / (volume / 1e6)))
            items, _ = bill(pt, "powertools", contract, CONFIGS["default"], volume, "x86")
            row.append(money(sum(items.values()) / (volume / 1e6)))
            rows.append(row)
        print(table(rows, head))
        print(f"\nThe mix, by line item ($ per million unique events; latency at 50 % / 100 % / 150 %):\n")
        lines = {}
        for name, cfg in list(CONFIGS.items())[:2]:
            for scale in (0.5, 1.0, 1.5):
                items, _ = bill(hook, "hookledger", "mix", cfg, volume, "x86", scale)
                for k, v in items.items():
                    lines.setdefault(k, {}).setdefault(name, []).append(v / (volume / 1e6))
        pt_items, _ = bill(pt, "powertools", "mix", CONFIGS["default"], volume, "x86")
        rows = []
        for k, by in lines.items():
            rows.append([k] + [" / ".join(f"{x:.2f}" for x in by.get(n, [0, 0, 0])) for n in ("default", "lean")]
                        + [f"{pt_items.get(k, 0) / (volume / 1e6):.2f}"])
        totals = [sum(lines[k].get(n, [0, 0, 0])[i] for k in lines) for n in ("default", "lean") for i in range(3)]
        rows.append(["**total**", " / ".join(f"{x:.2f}" for x in totals[:3]), " / ".join(f"{x:.2f}" for x in totals[3:]),
                     f"{sum(pt_items.values()) / (volume / 1e6):.2f}"])
        print(table(rows, ["line item", "default", "lean", "Powertools-Python"]))
        print(f"\nMonthly fixed cost at {volume // 1_000_000} M events:\n")
        rows = []
        for name, cfg in list(CONFIGS.items())[:2]:
            f = fixed(cfg, volume, stored, "hookledger")
            rows.append([name, money(sum(f.values())), "; ".join(f"{k} {money(v)}" for k, v in f.items())])
        rows.append(["Powertools-Python", money(sum(fixed(CONFIGS["default"], volume, stored, "powertools").values())),
                     "its idempotency records for an hour (no ledger, no alarms, no reconciler)"])
        print(table(rows, ["", "$ a month", "lines"]))
        print(f"\nAll in, a month at {volume // 1_000_000} M events (the mix):\n")
        rows = []
        for name, cfg in list(CONFIGS.items())[:2]:
            items, _ = bill(hook, "hookledger", "mix", cfg, volume, "x86")
            rows.append([f"Hookledger {name}", money(sum(items.values()) + sum(fixed(cfg, volume, stored, "hookledger").values()))])
        items, _ = bill(pt, "powertools", "mix", CONFIGS["default"], volume, "x86")
        rows.append(["Powertools-Python pattern (no fence, a 1-hour window)", money(sum(items.values()))])
        p = PRICES
        rows.append(["Hookdeck (list: plan + $1.00 per 100,000)", money(p["peer_hookdeck"]["plan"] + price(p, "peer_hookdeck", volume))])
        rows.append(["Svix (list: plan + $100 per million)", money(p["peer_svix"]["plan"] + price(p, "peer_svix", volume))])
        rows.append(["Convoy Premium (list)", money(p["peer_convoy"]["plan"])])
        print(table(rows, ["", "$ a month"]))


if __name__ == "__main__":
    main()
