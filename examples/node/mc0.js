"use strict";
// A minimal mc0 1.0 client for Node.js, written from docs/PROTOCOL.md alone (the `zeromq` package, v6):
// CURVE key files, CONNECT with a TTL, heartbeats, SUB/PUT/MESSAGE, REQUEST with PARTIAL/FINAL/ERROR,
// healing after a broker restart. Unbatched (BATCH 1 is optional), not a worker.
const fs = require("fs");
const zmq = require("zeromq");

// A ZeroMQ certificate ("Key files"): sections at column 0, indented `key = "value"` lines, # comments.
function readKeyFile(path) {
  const props = {};
  let section = "";
  for (const line of fs.readFileSync(path, "ascii").split(/\r?\n/)) {
    if (!line.trim() || line.trimStart().startsWith("#")) continue;
    if (!/^\s/.test(line)) section = line.trim();
    else {
      const m = /^\s+([\w-]+)\s*=\s*"([^"]*)"\s*$/.exec(line);
      if (m) props[`${section}.${m[1]}`] = m[2];
    }
  }
  return props;
}

class Mc0Error extends Error {
  constructor(code, message) {
    super(`${code} ${message}`);
    this.code = code;
  }
}

// "Topics and patterns": `*` is one token, `>` one or more trailing tokens; mc0.sys.* only when named.
function matches(pattern, topic) {
  const p = pattern.split("."), t = topic.split(".");
  if (topic.startsWith("mc0.sys.") && !pattern.startsWith("mc0.sys.")) return false;
  for (let i = 0; i < p.length; i++) {
    if (p[i] === ">") return t.length > i;
    if (i >= t.length || (p[i] !== "*" && p[i] !== t[i])) return false;
  }
  return p.length === t.length;
}

// "Message format": [VERB, K1, V1, ..., "", P1...]; an empty frame where a key is expected ends the headers.
function parse(frames) {
  const headers = {};
  let i = 1;
  while (i < frames.length && frames[i].length > 0) {
    headers[frames[i].toString()] = (frames[i + 1] || Buffer.alloc(0)).toString("utf8");
    i += 2;
  }
  return { verb: frames[0].toString(), headers, payload: frames.slice(i + 1) };
}

class Client {
  constructor(endpoint, { key, brokerKey, ttl = 5000, onEvent = () => {} } = {}) {
    this.endpoint = endpoint;
    this.ttl = ttl; // asked for; the OK says the one in force
    this.onEvent = onEvent; // ({event: "connected" | "lost" | "fault", ...})
    this.sock = new zmq.Dealer({ linger: 0 });
    if (key) {
      const mine = readKeyFile(key), broker = readKeyFile(brokerKey);
      this.sock.curveServerKey = broker["curve.public-key"];
      this.sock.curvePublicKey = mine["curve.public-key"];
      this.sock.curveSecretKey = mine["curve.secret-key"];
    }
    this.seq = 0;
    this.pending = new Map(); // ID -> {resolve, reject, onPartial}: commands not answered yet
    this.subs = new Map(); // pattern -> handler(message)
    this.sending = Promise.resolve();
    this.everConnected = false;
    this.linkLost = false;
  }

  // Resolves once the broker's OK arrives; rejects on a refused key ("A refused key") or after timeoutMs.
  connect(timeoutMs = 5000) {
    const events = this.sock.events;
    const refused = (why) => this.connectFailed && this.connectFailed(new Mc0Error(401, why));
    events.on("handshake:error:auth", () => refused("key refused by the broker"));
    events.on("handshake:error:other", () => refused("handshake failed: wrong broker key?"));
    events.on("handshake:error:protocol", () => refused("handshake failed: not a CURVE broker?"));
    events.on("disconnect", () => { this.linkLost = true; });
    events.on("handshake", () => { if (this.linkLost) this.heal("connection back"); });
    this.sock.connect(this.endpoint);
    this.receiving = this.receive().catch(() => {}); // (ends with an error when the socket closes)
    this.timer = setInterval(() => this.tick(), 50);
    const answered = new Promise((resolve, reject) => {
      this.connectDone = resolve;
      this.connectFailed = reject;
    });
    this.sendConnect();
    const late = new Promise((_, reject) =>
      setTimeout(() => reject(new Mc0Error(504, `no OK from ${this.endpoint} within ${timeoutMs} ms`)), timeoutMs));
    return Promise.race([answered, late]);
  }

  send(...frames) {
    this.lastSent = Date.now();
    this.sending = this.sending.then(() => this.sock.send(frames)).catch(() => {});
    return this.sending;
  }

  sendConnect() {
    this.connected = false;
    this.connectSent = Date.now();
    this.connectId = `c${++this.seq}`; // always with an ID: without one the OK never comes ("Connecting")
    this.lastHeard = Date.now();
    this.send("CONNECT", "VERSION", "1.0", "TTL", String(this.ttl), "ID", this.connectId);
  }

  // "Healing after a broker restart": CONNECT again, then SUB again; requests in flight are lost.
  heal(why) {
    this.linkLost = false;
    if (this.closed || (!this.connected && Date.now() - this.connectSent < this.ttl)) return; // one at a time
    for (const [id, call] of this.pending) { this.pending.delete(id); call.reject(new Mc0Error(401, why)); }
    this.onEvent({ event: "lost", why });
    this.sendConnect();
  }

  // "Heartbeats and liveness": NOOP after half the TTL of our silence; the broker is gone after 3 TTLs.
  tick() {
    const now = Date.now(), ttl = this.ttlInForce || this.ttl;
    if (now - this.lastSent >= ttl / 2) this.send("NOOP");
    if (now - this.lastHeard >= 3 * ttl) this.heal("broker silent");
  }

  async receive() {
    for await (const frames of this.sock) {
      this.lastHeard = Date.now();
      const { verb, headers, payload } = parse(frames);
      const id = headers.ID, call = id !== undefined ? this.pending.get(id) : undefined;
      if (verb === "OK" && id === this.connectId) this.connectedTo(Number(headers.TTL));
      else if (verb === "ERROR" && id === this.connectId) this.refused(new Mc0Error(Number(headers.CODE), headers.MESSAGE));
      else if (verb === "MESSAGE") {
        const message = { topic: headers.TOPIC, sender: headers.SENDER, headers, body: payload };
        for (const [pattern, handler] of this.subs) if (matches(pattern, headers.TOPIC)) handler(message);
      } else if (verb === "PARTIAL" && call) call.onPartial(payload, headers);
      else if ((verb === "OK" || verb === "FINAL") && call) { this.pending.delete(id); call.resolve(payload); }
      else if (verb === "ERROR" && call) { this.pending.delete(id); call.reject(new Mc0Error(Number(headers.CODE), headers.MESSAGE)); }
      else if (verb === "ERROR" && headers.CODE === "401") this.heal(`broker: ${headers.MESSAGE}`);
      else if (verb === "ERROR") this.onEvent({ event: "fault", code: Number(headers.CODE), message: headers.MESSAGE });
      else if (verb === "DISCONNECT") this.heal("broker sent DISCONNECT");
    }
  }

  refused(error) {
    this.connectFailed(error); // (after the first CONNECT, a refusal is a fault to report)
    this.onEvent({ event: "fault", code: error.code, message: error.message });
  }

  connectedTo(ttl) {
    this.ttlInForce = ttl;
    const healed = this.everConnected;
    this.connected = this.everConnected = true;
    // The SUBs may follow the CONNECT at once; waiting for the OK keeps a refused CONNECT simple.
    const again = [...this.subs.keys()].map((pattern) => this.command(["SUB"], ["", pattern]));
    Promise.all(again).then(
      () => this.onEvent({ event: "connected", ttl, healed, resubscribed: again.length }),
      (error) => this.onEvent({ event: "fault", code: error.code, message: error.message }));
    this.connectDone(ttl);
  }

  // A command with an ID: resolves with the OK's (or FINAL's) positional frames, rejects with its ERROR.
  command(head, tail, { onPartial = () => {} } = {}) {
    const id = String(++this.seq);
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, onPartial });
      this.send(...head, "ID", id, ...tail);
    });
  }

  subscribe(pattern, handler) {
    this.subs.set(pattern, handler);
    return this.command(["SUB"], ["", pattern]);
  }

  publish(topic, body, headers = {}) {
    const pairs = Object.entries(headers).flat(); // user headers: "X-..." keys
    return this.command(["PUT", "TOPIC", topic, ...pairs], ["", body]);
  }

  request(service, body, { timeoutMs = 30000, onPartial = () => {} } = {}) {
    return this.command(["REQUEST", "SERVICE", service, "TIMEOUT", String(timeoutMs)], ["", body], { onPartial });
  }

  async close() {
    this.closed = true;
    clearInterval(this.timer);
    const bye = this.command(["DISCONNECT"], []);
    await Promise.race([bye, new Promise((resolve) => setTimeout(resolve, 1000))]).catch(() => {});
    this.sock.close();
  }
}

module.exports = { Client, Mc0Error, readKeyFile, matches };
