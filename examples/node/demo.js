"use strict";
// Drives the example client from standard input, one JSON command a line, and prints what happens as
// JSON lines: how tests/test_node_example.py runs it against a real broker.
//   MC0_ENDPOINT=tcp://127.0.0.1:61616 MC0_KEY=keys/alice.key_secret MC0_BROKER_KEY=keys/broker.key node demo.js
//   {"op": "sub", "pattern": "demo.>"}   {"op": "pub", "topic": "demo.x", "body": "hi"}
//   {"op": "call", "service": "greet", "body": "world"}   {"op": "close"}
const readline = require("readline");
const { Client } = require("./mc0");

const say = (what) => process.stdout.write(JSON.stringify(what) + "\n");
const text = (frames) => frames.map((frame) => frame.toString("utf8"));

async function main() {
  const env = process.env;
  const client = new Client(env.MC0_ENDPOINT || "tcp://127.0.0.1:61616", {
    key: env.MC0_KEY, brokerKey: env.MC0_BROKER_KEY, ttl: Number(env.MC0_TTL || 5000), onEvent: say });
  try {
    say({ event: "ready", ttl: await client.connect() });
  } catch (error) {
    say({ event: "refused", code: error.code, message: error.message });
    process.exit(1);
  }
  const ops = {
    sub: (c) => client.subscribe(c.pattern, (m) => say({ event: "message", topic: m.topic, sender: m.sender,
      body: text(m.body) })).then(() => ({ event: "subscribed", pattern: c.pattern })),
    pub: (c) => client.publish(c.topic, c.body, c.headers).then(() => ({ event: "published", topic: c.topic })),
    call: (c) => client.request(c.service, c.body, { timeoutMs: c.timeout_ms || 10000,
      onPartial: (body) => say({ event: "partial", service: c.service, body: text(body) }) })
      .then((body) => ({ event: "final", service: c.service, body: text(body) })),
    close: () => client.close().then(() => process.exit(0)),
  };
  for await (const line of readline.createInterface({ input: process.stdin })) {
    const c = JSON.parse(line);
    ops[c.op](c).then(say, (error) => say({ event: "error", op: c.op, code: error.code, message: error.message }));
  }
  await client.close();
}

main();
