/**
 * A consumer of Hookledger's HTTPS deliveries, which are signed as Standard
 * Webhooks (https://www.standardwebhooks.com/): `webhook-id`,
 * `webhook-timestamp` (unix seconds) and `webhook-signature` (`v1,<base64>`,
 * several space-separated while a secret is being rotated).
 *
 * - Verify on the raw bytes of the body, exactly as received, BEFORE parsing
 *   it: a body parsed and serialized again is not the body that was signed.
 *   A bad signature (or a timestamp outside the library's tolerance, five
 *   minutes) answers 401 and the body is never parsed; a missing header 400.
 * - `webhook-id` is Hookledger's idempotency key for (event, destination).
 *   Hookledger delivers at least once and retries a delivery for 24 hours
 *   with the same `webhook-id`, so de-duplicate on it and keep the ids you
 *   have seen at least that long (the in-memory store below keeps them 48 h;
 *   a consumer that runs more than one process needs a shared store, such as
 *   a database table with a unique key, behind the same interface).
 * - The team's handler runs once per id. A repeat answers 200
 *   `{"duplicate":true}` without running it; a first delivery answers 204
 *   once the handler has finished. A handler that throws answers 500 and
 *   releases the id, so Hookledger's retry runs it again.
 */

import { Webhook, WebhookVerificationError } from "standardwebhooks";

/** The body of a delivery. Exactly one of `event`, `event_base64` and `payload_ref` is present. */
export interface Envelope {
  idempotency_key: string;
  destination: string;
  provider: string;
  endpoint: string;
  tenant: string;
  event_id: string;
  event_type: string | null;
  via: string;
  received_at: string;
  processed_at: string;
  subject: unknown;
  /** The provider's JSON body, as received. */
  event?: unknown;
  /** A provider body that is not JSON, base64-encoded. */
  event_base64?: string;
  /** A provider body too large to inline: where Hookledger stored it. */
  payload_ref?: { bucket: string; key: string; sha256: string };
}

/** What the handler is told besides the envelope. */
export interface Delivery {
  webhookId: string;
  /** `webhook-timestamp`, unix seconds. */
  timestamp: number;
}

/** The team's own logic: run once per `webhook-id`. */
export type Handler = (envelope: Envelope, delivery: Delivery) => void | Promise<void>;

/**
 * Where the ids already seen are kept. `claim` must be atomic: of two
 * concurrent claims of one id, one alone gets "new".
 */
export interface IdStore {
  /** "new": the caller now holds the id and runs the handler; "done": already handled; "busy": being handled now. */
  claim(id: string): Promise<"new" | "done" | "busy">;
  /** The handler finished: the id is kept (at least 24 hours). */
  complete(id: string): Promise<void>;
  /** The handler failed: forget the id, so that a retry runs it again. */
  release(id: string): Promise<void>;
}

/** Hookledger retries a delivery for this long, with the same `webhook-id`. */
export const HOOKLEDGER_RETRY_WINDOW_MS = 24 * 60 * 60 * 1000;

/** An IdStore in this process's memory, keeping each id `retentionMs` (48 hours unless told). */
export class MemoryIdStore implements IdStore {
  private readonly ids = new Map<string, { state: "busy" | "done"; at: number }>();

  constructor(
    private readonly retentionMs = 2 * HOOKLEDGER_RETRY_WINDOW_MS,
    private readonly now: () => number = Date.now,
  ) {
    if (retentionMs < HOOKLEDGER_RETRY_WINDOW_MS) {
      throw new Error("keep webhook ids at least 24 hours: Hookledger retries a delivery that long");
    }
  }

  async claim(id: string): Promise<"new" | "done" | "busy"> {
    this.prune();
    const seen = this.ids.get(id);
    if (seen) return seen.state;
    this.ids.set(id, { state: "busy", at: this.now() });
    return "new";
  }

  async complete(id: string): Promise<void> {
    // Re-inserted, so that the map stays in the order of completion for prune().
    this.ids.delete(id);
    this.ids.set(id, { state: "done", at: this.now() });
  }

  async release(id: string): Promise<void> {
    this.ids.delete(id);
  }

  get size(): number {
    return this.ids.size;
  }

  /** Drops the ids older than the retention, oldest first (a Map iterates in insertion order). */
  private prune(): void {
    const horizon = this.now() - this.retentionMs;
    for (const [id, { at }] of this.ids) {
      if (at >= horizon) break;
      this.ids.delete(id);
    }
  }
}

export type Headers = Record<string, string | string[] | undefined>;

/** What to answer, and what was delivered (when the signature held). */
export interface Outcome {
  status: number;
  body?: Record<string, unknown>;
  webhookId?: string;
  envelope?: Envelope;
  /** True for a repeat of an id already handled. */
  duplicate?: boolean;
  /** What the handler threw (the answer is then 500). */
  error?: unknown;
}

export const REQUIRED_HEADERS = ["webhook-id", "webhook-timestamp", "webhook-signature"] as const;

export interface ConsumerOptions {
  /** One `whsec_...` secret, or several during a rotation: a delivery signed with any of them is accepted. */
  secrets: string | string[];
  handler: Handler;
  store?: IdStore;
}

export class Consumer {
  private readonly verifiers: Webhook[];
  private readonly handler: Handler;
  readonly store: IdStore;

  constructor(options: ConsumerOptions) {
    const secrets = (typeof options.secrets === "string" ? [options.secrets] : options.secrets)
      .map((s) => s.trim())
      .filter((s) => s !== "");
    if (secrets.length === 0) throw new Error("no secret given");
    this.verifiers = secrets.map((s) => new Webhook(s));
    this.handler = options.handler;
    this.store = options.store ?? new MemoryIdStore();
  }

  /** Handles one delivery: `rawBody` is the body's bytes exactly as received. */
  async handle(rawBody: string | Buffer, rawHeaders: Headers): Promise<Outcome> {
    const headers: Record<string, string> = {};
    for (const [name, value] of Object.entries(rawHeaders)) {
      const text = Array.isArray(value) ? value.join(" ") : value;
      if (text !== undefined) headers[name.toLowerCase()] = text;
    }
    const missing = REQUIRED_HEADERS.filter((name) => !headers[name]);
    if (missing.length > 0) {
      return { status: 400, body: { error: `missing header: ${missing.join(", ")}` } };
    }
    if (!/^\d+$/.test(headers["webhook-timestamp"]!)) {
      return { status: 400, body: { error: "webhook-timestamp is not unix seconds" } };
    }
    const verified = { "webhook-id": headers["webhook-id"]!, "webhook-timestamp": headers["webhook-timestamp"]!,
      "webhook-signature": headers["webhook-signature"]! };

    // Verify first, on the raw bytes; nothing of the body is parsed before.
    let failure: unknown;
    let ok = false;
    for (const verifier of this.verifiers) {
      try {
        verifier.verify(rawBody, verified, { jsonParse: false });
        ok = true;
        break;
      } catch (err) {
        failure = err;
      }
    }
    if (!ok) {
      const reason = failure instanceof WebhookVerificationError ? failure.message : "verification failed";
      return { status: 401, body: { error: reason } };
    }

    const webhookId = verified["webhook-id"];
    let envelope: Envelope;
    try {
      const parsed: unknown = JSON.parse(rawBody.toString());
      if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new Error("not an object");
      envelope = parsed as Envelope;
    } catch {
      return { status: 400, body: { error: "body is not a JSON object" }, webhookId };
    }

    const claim = await this.store.claim(webhookId);
    if (claim === "done") {
      return { status: 200, body: { duplicate: true }, webhookId, envelope, duplicate: true };
    }
    if (claim === "busy") {
      // The first delivery of this id is still being handled: ask for a retry later.
      return { status: 409, body: { error: "this webhook-id is being handled" }, webhookId, envelope };
    }
    try {
      await this.handler(envelope, { webhookId, timestamp: Number(verified["webhook-timestamp"]) });
    } catch (error) {
      await this.store.release(webhookId);
      return { status: 500, body: { error: "handler failed" }, webhookId, envelope, error };
    }
    await this.store.complete(webhookId);
    return { status: 204, webhookId, envelope, duplicate: false };
  }
}
