/**
 * Checks the deliveries that a real run recorded: the server, run with
 * RECORD_FILE, appends one JSON line per accepted delivery
 * {"webhook_id","event_id","provider","event_type","duplicate"}.
 *
 *   RECORD_FILE=record.jsonl EXPECTED_EVENTS=expected.jsonl node --test dist/test/deliveries.test.js
 *
 * EXPECTED_EVENTS holds one JSON line {"provider","event_id"} per event that
 * the run sent through Hookledger to this consumer's destination. Without
 * both variables the tests are skipped (`npm test` runs them skipped).
 *
 * What is asserted:
 * - every expected (provider, event_id) was accepted (duplicate:false)
 *   exactly once: the handler ran once per event;
 * - no webhook-id was accepted twice;
 * - every duplicate:true line repeats a webhook-id accepted earlier in the
 *   record (redeliveries are allowed, but only of what was already accepted).
 * Events in the record that are not in the expected list are tolerated, and
 * listed as diagnostics: the destination's route may forward more events
 * than the run counted. The record is of one destination: one event routed
 * to two destinations that both point here is accepted once under each id.
 */

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

interface Recorded {
  webhook_id: string;
  event_id: string;
  provider: string;
  event_type: string | null;
  duplicate: boolean;
}

interface Expected {
  provider: string;
  event_id: string;
}

const recordFile = process.env.RECORD_FILE;
const expectedFile = process.env.EXPECTED_EVENTS;
const skip =
  recordFile && expectedFile
    ? false
    : "set RECORD_FILE (the consumer's record of a real run) and EXPECTED_EVENTS (one {\"provider\",\"event_id\"} line per expected event) to check recorded deliveries";

function jsonLines<T>(file: string, what: string, valid: (v: any) => boolean): T[] {
  const text = readFileSync(file, "utf8");
  return text
    .split("\n")
    .map((line, i) => [line.trim(), i + 1] as const)
    .filter(([line]) => line !== "")
    .map(([line, n]) => {
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        assert.fail(`${what} line ${n} is not JSON: ${line}`);
      }
      assert.ok(valid(value), `${what} line ${n} is not a ${what} line: ${line}`);
      return value as T;
    });
}

const key = (e: { provider: string; event_id: string }): string => JSON.stringify([e.provider, e.event_id]);

describe("deliveries recorded by a real run", () => {
  const load = () => {
    const record = jsonLines<Recorded>(recordFile!, "record", (v) =>
      typeof v?.webhook_id === "string" && typeof v.event_id === "string" && typeof v.provider === "string" &&
      typeof v.duplicate === "boolean");
    const expected = jsonLines<Expected>(expectedFile!, "expected event", (v) =>
      typeof v?.provider === "string" && typeof v.event_id === "string");
    assert.ok(expected.length > 0, `EXPECTED_EVENTS (${expectedFile}) lists no event`);
    return { record, expected, accepted: record.filter((r) => !r.duplicate) };
  };

  test("every expected event was accepted exactly once", { skip }, (t) => {
    const { record, expected, accepted } = load();
    const times = new Map<string, number>();
    for (const r of accepted) times.set(key(r), (times.get(key(r)) ?? 0) + 1);
    const problems = [...new Set(expected.map(key))]
      .filter((k) => times.get(k) !== 1)
      .map((k) => `${k}: accepted ${times.get(k) ?? 0} times`);
    assert.deepEqual(problems, [], `expected events not accepted exactly once:\n${problems.join("\n")}`);

    const wanted = new Set(expected.map(key));
    const extra = accepted.filter((r) => !wanted.has(key(r)));
    t.diagnostic(`${expected.length} expected, ${accepted.length} accepted, ${record.length - accepted.length} duplicates`);
    for (const r of extra) t.diagnostic(`accepted but not expected (tolerated): ${key(r)}`);
  });

  test("no webhook-id was accepted twice", { skip }, () => {
    const { accepted } = load();
    const seen = new Set<string>();
    const twice = accepted.filter((r) => seen.size === seen.add(r.webhook_id).size).map((r) => r.webhook_id);
    assert.deepEqual(twice, [], "webhook-ids accepted more than once");
  });

  test("a duplicate only repeats a webhook-id accepted before it", { skip }, () => {
    const { record } = load();
    const accepted = new Set<string>();
    const orphans: string[] = [];
    for (const r of record) {
      if (!r.duplicate) accepted.add(r.webhook_id);
      else if (!accepted.has(r.webhook_id)) orphans.push(`${r.webhook_id} (${key(r)})`);
    }
    assert.deepEqual(orphans, [], "duplicates of ids never accepted");
  });
});
