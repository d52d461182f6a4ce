/**
 * An HTTP server around Consumer: POST a delivery to any path (Hookledger's
 * destination URL names it, e.g. /hooks).
 *
 * Environment (when run as `node dist/src/server.js`):
 * - HOOKLEDGER_DESTINATION_SECRET: the destination's `whsec_...` secret;
 *   several comma-separated during a rotation (a delivery signed with any of
 *   them is accepted).
 * - PORT: the port on 127.0.0.1 (0 or unset: any free one). The server prints
 *   `listening on http://127.0.0.1:<port>` once it listens.
 * - RECORD_FILE: if set, each accepted delivery is appended to it as one JSON
 *   line {"webhook_id","event_id","provider","event_type","duplicate"},
 *   before the answer is sent.
 *
 * Stops cleanly on SIGTERM (and SIGINT). Serve it behind TLS (a load
 * balancer or a reverse proxy): Hookledger delivers over HTTPS.
 */

import { appendFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

import { Consumer, type Handler, type IdStore, type Outcome } from "./consumer";

/** Bodies larger than this are refused with 413. */
export const DEFAULT_MAX_BODY_BYTES = 1024 * 1024;

export interface StartOptions {
  secrets: string | string[];
  /** 0 (the default): any free port. */
  port?: number;
  host?: string;
  /** Where to append one JSON line per accepted delivery. */
  recordFile?: string;
  maxBodyBytes?: number;
  /** The team's logic, run once per webhook-id (by default it does nothing). */
  handler?: Handler;
  store?: IdStore;
}

export interface Running {
  server: Server;
  consumer: Consumer;
  port: number;
  url: string;
  close(): Promise<void>;
}

class TooLarge extends Error {}

function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers["content-length"] ?? 0);
    if (declared > limit) {
      reject(new TooLarge());
      return;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > limit) {
        req.off("data", onData);
        reject(new TooLarge());
        return;
      }
      chunks.push(chunk);
    };
    req.on("data", onData);
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

function send(res: ServerResponse, status: number, body?: Record<string, unknown>, close = false): void {
  const headers: Record<string, string> = {};
  if (close) headers.connection = "close";
  if (body === undefined || status === 204) {
    res.writeHead(status, headers).end();
  } else {
    headers["content-type"] = "application/json";
    res.writeHead(status, headers).end(JSON.stringify(body));
  }
}

export async function start(options: StartOptions): Promise<Running> {
  const consumer = new Consumer({
    secrets: options.secrets,
    handler: options.handler ?? (() => {}),
    store: options.store,
  });
  const limit = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const host = options.host ?? "127.0.0.1";

  // Appends one line at a time, in the order the answers are decided.
  let recording: Promise<void> = Promise.resolve();
  const record = (outcome: Outcome): Promise<void> => {
    const file = options.recordFile;
    if (!file || !outcome.webhookId || !outcome.envelope) return Promise.resolve();
    const line = JSON.stringify({
      webhook_id: outcome.webhookId,
      event_id: outcome.envelope.event_id,
      provider: outcome.envelope.provider,
      event_type: outcome.envelope.event_type,
      duplicate: outcome.duplicate === true,
    }) + "\n";
    recording = recording.then(() => appendFile(file, line));
    return recording;
  };

  const server = createServer((req, res) => {
    if (req.method !== "POST") {
      res.setHeader("allow", "POST");
      send(res, 405, { error: "POST only" });
      req.resume();
      return;
    }
    readBody(req, limit)
      .then(async (body) => {
        const outcome = await consumer.handle(body, req.headers);
        if (outcome.error !== undefined) console.error(`handler failed for ${outcome.webhookId}:`, outcome.error);
        if (outcome.status === 200 || outcome.status === 204) await record(outcome);
        send(res, outcome.status, outcome.body);
      })
      .catch((err: unknown) => {
        if (res.headersSent) return;
        if (err instanceof TooLarge) {
          // Answer at once and close the connection; the rest of the body is discarded.
          send(res, 413, { error: `body over ${limit} bytes` }, true);
          req.resume();
        } else {
          console.error("delivery failed:", err);
          send(res, 500, { error: "internal error" });
        }
      });
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  const port = (server.address() as AddressInfo).port;

  const close = async (): Promise<void> => {
    await new Promise<void>((resolve, reject) => {
      server.close((err) => (err ? reject(err) : resolve()));
      server.closeIdleConnections();
    });
    await recording;
  };
  return { server, consumer, port, url: `http://${host}:${port}`, close };
}

async function main(): Promise<void> {
  const secrets = (process.env.HOOKLEDGER_DESTINATION_SECRET ?? "").split(",").map((s) => s.trim()).filter(Boolean);
  if (secrets.length === 0) {
    console.error("set HOOKLEDGER_DESTINATION_SECRET to the destination's whsec_... secret (several comma-separated)");
    process.exit(2);
  }
  const port = Number(process.env.PORT ?? "0");
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`PORT is not a port: ${process.env.PORT}`);
    process.exit(2);
  }
  const running = await start({ secrets, port, recordFile: process.env.RECORD_FILE || undefined });
  console.log(`listening on ${running.url}`);

  let stopping = false;
  const stop = (signal: string) => {
    if (stopping) return;
    stopping = true;
    console.log(`${signal}: stopping`);
    // Connections still busy after 10 s are cut.
    const timer = setTimeout(() => running.server.closeAllConnections(), 10_000);
    timer.unref();
    running.close().then(
      () => process.exit(0),
      (err: unknown) => {
        console.error(err);
        process.exit(1);
      },
    );
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
}

if (require.main === module) {
  main().catch((err: unknown) => {
    console.error(err);
    process.exit(1);
  });
}
