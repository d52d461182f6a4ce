import assert from "node:assert/strict";
import { randomBytes } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";

import { Webhook } from "standardwebhooks";

import { Consumer, type Envelope, MemoryIdStore, HOOKLEDGER_RETRY_WINDOW_MS } from "../src/consumer";
import { start } from "../src/server";

const newSecret = (): string => `whsec_${randomBytes(24).toString("base64")}`;
const SECRET = newSecret();

function envelope(eventId: string, extra: Partial<Envelope> = {}): Envelope {
  return {
    idempotency_key: "",
    destination: "partner",
    provider: "stripe",
    endpoint: "stripe-demo",
    tenant: "default",
    event_id: eventId,
    event_type: "invoice.paid",
    via: "webhook",
    received_at: "2026-12-02T10:00:00Z",
    processed_at: "2026-12-02T10:00:01Z",
    subject: null,
    event: { id: eventId, type: "invoice.paid", data: { object: { amount_paid: 1200 } } },
    ...extra,
  };
}

/** A delivery as Hookledger sends it: the body, and the three headers signed with `secret`. */
function delivery(secret: string, eventId: string, at = new Date(), id = randomBytes(32).toString("hex")) {
  const body = JSON.stringify({ ...envelope(eventId), idempotency_key: id });
  const headers: Record<string, string> = {
    "webhook-id": id,
    "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
    "webhook-signature": new Webhook(secret).sign(id, at, body),
    "content-type": "application/json",
  };
  return { id, body, headers };
}

function counting() {
  const seen: string[] = [];
  return { seen, handler: (e: Envelope) => void seen.push(e.event_id) };
}

describe("Consumer", () => {
  test("accepts a signed delivery once; the same webhook-id again is a duplicate", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    const d = delivery(SECRET, "evt_1");

    const first = await consumer.handle(Buffer.from(d.body), d.headers);
    assert.equal(first.status, 204);
    assert.equal(first.duplicate, false);
    assert.equal(first.envelope?.event_id, "evt_1");

    const again = await consumer.handle(Buffer.from(d.body), d.headers);
    assert.equal(again.status, 200);
    assert.deepEqual(again.body, { duplicate: true });
    assert.equal(again.duplicate, true);
    assert.deepEqual(seen, ["evt_1"], "the handler ran once");
  });

  test("a retry signed at a later time, with the same webhook-id, is still a duplicate", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    const d = delivery(SECRET, "evt_1");
    const retry = delivery(SECRET, "evt_1", new Date(Date.now() + 60_000), d.id);
    assert.equal((await consumer.handle(d.body, d.headers)).status, 204);
    assert.equal((await consumer.handle(retry.body, retry.headers)).status, 200);
    assert.deepEqual(seen, ["evt_1"]);
  });

  test("a tampered body is refused with 401 and the handler does not run", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    const d = delivery(SECRET, "evt_1");
    const tampered = d.body.replace("1200", "9999");
    assert.notEqual(tampered, d.body);
    const outcome = await consumer.handle(Buffer.from(tampered), d.headers);
    assert.equal(outcome.status, 401);
    assert.equal(outcome.envelope, undefined, "the body was not parsed");
    assert.deepEqual(seen, []);
  });

  test("an unsigned body that is not JSON is refused with 401: it is never parsed", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    const d = delivery(SECRET, "evt_1");
    const outcome = await consumer.handle("{not json", d.headers);
    assert.equal(outcome.status, 401);
    assert.deepEqual(seen, []);
  });

  test("a signed body that is not a JSON object is refused with 400", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    for (const body of ["{not json", "[1,2]", "null"]) {
      const at = new Date();
      const id = randomBytes(32).toString("hex");
      const headers = { "webhook-id": id, "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
        "webhook-signature": new Webhook(SECRET).sign(id, at, body) };
      assert.equal((await consumer.handle(body, headers)).status, 400, body);
    }
    assert.deepEqual(seen, []);
  });

  test("a delivery signed with another secret is refused with 401", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    const d = delivery(newSecret(), "evt_1");
    const outcome = await consumer.handle(d.body, d.headers);
    assert.equal(outcome.status, 401);
    assert.deepEqual(seen, []);
  });

  test("a timestamp outside the tolerance is refused, old or new", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    const old = delivery(SECRET, "evt_old", new Date(Date.now() - 10 * 60_000));
    const outcome = await consumer.handle(old.body, old.headers);
    assert.equal(outcome.status, 401);
    assert.match(String(outcome.body?.error), /too old/);
    const future = delivery(SECRET, "evt_new", new Date(Date.now() + 10 * 60_000));
    assert.equal((await consumer.handle(future.body, future.headers)).status, 401);
    assert.deepEqual(seen, []);
  });

  test("a missing header is refused with 400", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    for (const name of ["webhook-id", "webhook-timestamp", "webhook-signature"]) {
      const d = delivery(SECRET, "evt_1");
      delete d.headers[name];
      const outcome = await consumer.handle(d.body, d.headers);
      assert.equal(outcome.status, 400, name);
      assert.match(String(outcome.body?.error), new RegExp(name));
    }
    assert.deepEqual(seen, []);
  });

  test("rotation: of two signatures in the header, the second alone matching is enough", async () => {
    const { seen, handler } = counting();
    const consumer = new Consumer({ secrets: SECRET, handler });
    const d = delivery(SECRET, "evt_1");
    const stale = delivery(newSecret(), "evt_1", new Date(), d.id).headers["webhook-signature"];
    const headers = { ...d.headers, "webhook-signature": `${stale} ${d.headers["webhook-signature"]}` };
    assert.equal((await consumer.handle(d.body, headers)).status, 204);
    assert.deepEqual(seen, ["evt_1"]);
  });

  test("rotation: the consumer holding the old and the new secret accepts either", async () => {
    const { seen, handler } = counting();
    const next = newSecret();
    const consumer = new Consumer({ secrets: [SECRET, next], handler });
    const a = delivery(SECRET, "evt_a");
    const b = delivery(next, "evt_b");
    assert.equal((await consumer.handle(a.body, a.headers)).status, 204);
    assert.equal((await consumer.handle(b.body, b.headers)).status, 204);
    assert.deepEqual(seen, ["evt_a", "evt_b"]);
  });

  test("a handler that throws answers 500 and the retry runs it again", async () => {
    let calls = 0;
    const consumer = new Consumer({
      secrets: SECRET,
      handler: () => {
        calls += 1;
        if (calls === 1) throw new Error("database down");
      },
    });
    const d = delivery(SECRET, "evt_1");
    assert.equal((await consumer.handle(d.body, d.headers)).status, 500);
    assert.equal((await consumer.handle(d.body, d.headers)).status, 204);
    assert.equal((await consumer.handle(d.body, d.headers)).status, 200);
    assert.equal(calls, 2);
  });

  test("concurrent deliveries of one id run the handler once", async () => {
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let calls = 0;
    const consumer = new Consumer({ secrets: SECRET, handler: async () => { calls += 1; await gate; } });
    const d = delivery(SECRET, "evt_1");
    const first = consumer.handle(d.body, d.headers);
    const second = await consumer.handle(d.body, d.headers);
    assert.equal(second.status, 409, "in flight: retry later");
    release();
    assert.equal((await first).status, 204);
    assert.equal(calls, 1);
  });

  test("the in-memory store keeps ids at least 24 hours and forgets them after its retention", async () => {
    assert.throws(() => new MemoryIdStore(HOOKLEDGER_RETRY_WINDOW_MS - 1));
    let now = 0;
    const store = new MemoryIdStore(HOOKLEDGER_RETRY_WINDOW_MS, () => now);
    assert.equal(await store.claim("a"), "new");
    await store.complete("a");
    now = HOOKLEDGER_RETRY_WINDOW_MS;
    assert.equal(await store.claim("a"), "done");
    now = HOOKLEDGER_RETRY_WINDOW_MS + 1;
    assert.equal(await store.claim("b"), "new");
    assert.equal(await store.claim("a"), "new");
  });
});

describe("server", () => {
  test("answers deliveries over HTTP and records them", async () => {
    const dir = await mkdtemp(join(tmpdir(), "hookledger-consumer-"));
    const recordFile = join(dir, "record.jsonl");
    const { seen, handler } = counting();
    const running = await start({ secrets: [newSecret(), SECRET], port: 0, recordFile, handler, maxBodyBytes: 4096 });
    try {
      assert.match(running.url, /^http:\/\/127\.0\.0\.1:\d+$/);
      const url = `${running.url}/hooks`;
      const d = delivery(SECRET, "evt_http");
      const post = (body: string, headers: Record<string, string>) => fetch(url, { method: "POST", body, headers });

      const first = await post(d.body, d.headers);
      assert.equal(first.status, 204);
      const again = await post(d.body, d.headers);
      assert.equal(again.status, 200);
      assert.deepEqual(await again.json(), { duplicate: true });

      const bad = delivery(newSecret(), "evt_bad");
      const refused = await post(bad.body, bad.headers);
      assert.equal(refused.status, 401);
      await refused.arrayBuffer();

      const noHeaders = await post(d.body, { "content-type": "application/json" });
      assert.equal(noHeaders.status, 400);
      await noHeaders.arrayBuffer();

      const get = await fetch(url);
      assert.equal(get.status, 405);
      assert.equal(get.headers.get("allow"), "POST");
      await get.arrayBuffer();

      const big = delivery(SECRET, "x".repeat(5000));
      const tooLarge = await post(big.body, big.headers);
      assert.equal(tooLarge.status, 413);
      await tooLarge.arrayBuffer();

      assert.deepEqual(seen, ["evt_http"]);
      const lines = (await readFile(recordFile, "utf8")).trim().split("\n").map((l) => JSON.parse(l));
      assert.deepEqual(lines, [
        { webhook_id: d.id, event_id: "evt_http", provider: "stripe", event_type: "invoice.paid", duplicate: false },
        { webhook_id: d.id, event_id: "evt_http", provider: "stripe", event_type: "invoice.paid", duplicate: true },
      ]);
    } finally {
      await running.close();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
