// The official TypeScript MCP client (@modelcontextprotocol/sdk, pinned in package.json) playing a host
// against a tether server, as desktop apps and IDEs do. tests/server/test_ts_client.py drives it.
//
// Input (stdin, JSON): {
//   transport: {stdio: {command, args, env, cwd}} | {http: {url, token?}},
//   elicitation?: [{action: "accept"|"decline"|"cancel", content?, match?, delayMs?}, ...]
//       declares the form capability; a request takes the first answer whose `match` is in its message,
//       else the next one, after `delayMs` (a user reading the form); none left: cancel
//   steps: [{op: "listTools"} | {op: "callTool", name, arguments, abortAfterMs?, quitAfterMs?, timeoutMs?}
//           | {op: "sleep", ms}],
//   deadlineMs?: the whole script's limit
// }
// Output (stdout, one JSON line): what the client saw — the negotiated protocol version, each step's result
// or the error the SDK threw, each elicitation request with the step it came during, progress notifications.
// The script decides nothing about tether: the test asserts on what it prints.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const read = async () => {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
};

const describeError = (err) => ({
  name: err?.constructor?.name ?? typeof err,
  code: err?.code ?? null,
  message: String(err?.message ?? err),
});

// Records what the SDK negotiated and every message either way, forwarding all of it unchanged.
class Recording {
  constructor(inner, seen) {
    this.inner = inner;
    this.seen = seen;
    inner.onmessage = (message, extra) => {
      this.seen.received.push(message);
      this.onmessage?.(message, extra);
    };
    inner.onclose = () => this.onclose?.();
    inner.onerror = (error) => {
      this.seen.errors.push(describeError(error));
      this.onerror?.(error);
    };
  }
  get sessionId() { return this.inner.sessionId; }
  start() { return this.inner.start(); }
  send(message, options) {
    this.seen.sent.push(message);
    return this.inner.send(message, options);
  }
  close() { return this.inner.close(); }
  setProtocolVersion(version) {
    this.seen.protocolVersion = version;
    this.inner.setProtocolVersion?.(version);
  }
}

const plan = await read();
const out = { protocolVersion: null, connected: false, steps: [], elicitations: [], progress: [] };
const seen = { sent: [], received: [], errors: [], http: [], protocolVersion: null };
const finish = (code) => {
  out.protocolVersion = seen.protocolVersion;
  out.sent = seen.sent.map((m) => ({ method: m.method ?? null, id: m.id ?? null, params: m.params ?? null }));
  out.received = seen.received.map((m) => ({ method: m.method ?? null, id: m.id ?? null }));
  out.transportErrors = seen.errors;
  out.http = seen.http;
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
};
// A hang is a finding, not a test timeout: say so and stop.
setTimeout(() => { out.hung = true; finish(3); }, plan.deadlineMs ?? 60000).unref();

const answers = plan.elicitation ? [...plan.elicitation] : null;
const client = new Client({ name: 'tether-ts-client-test', version: '1.0.0' },
  { capabilities: answers ? { elicitation: { form: {} } } : {} });
client.onerror = (error) => seen.errors.push(describeError(error));
let step = -1;
if (answers) {
  client.setRequestHandler(ElicitRequestSchema, async (request) => {
    out.elicitations.push({ step, params: request.params });
    // The first answer whose `match` is in the form's message, else the next in line.
    const at = answers.findIndex((a) => a.match !== undefined && request.params.message.includes(a.match));
    const picked = at >= 0 ? answers.splice(at, 1)[0] : answers.shift();
    const { delayMs, match, ...answer } = picked ?? { action: 'cancel' };
    // A user who takes this long to answer the form.
    if (delayMs) await new Promise((resolve) => setTimeout(resolve, delayMs));
    return answer;
  });
}

const t = plan.transport;
const inner = t.stdio
  ? new StdioClientTransport({ ...t.stdio, stderr: 'inherit' })
  : new StreamableHTTPClientTransport(new URL(t.http.url), {
    ...(t.http.token ? { requestInit: { headers: { Authorization: `Bearer ${t.http.token}` } } } : {}),
    // Each HTTP exchange's method and status, as the client's fetch saw them.
    fetch: async (url, init) => {
      const response = await fetch(url, init);
      const body = typeof init?.body === 'string' ? JSON.parse(init.body) : null;
      seen.http.push({ method: init?.method ?? 'GET', rpc: body?.method ?? (body?.id !== undefined ? 'response' : null),
        status: response.status });
      return response;
    },
  });
try {
  await client.connect(new Recording(inner, seen));
  out.connected = true;
  out.serverInfo = client.getServerVersion();
  out.serverCapabilities = client.getServerCapabilities();
} catch (err) {
  out.connectError = describeError(err);
  finish(0);
}

if (out.connected) {
  for (const s of plan.steps) {
    step += 1;
    const started = Date.now();
    const record = { op: s.op };
    try {
      if (s.op === 'listTools') {
        record.result = await client.listTools();
      } else if (s.op === 'callTool') {
        const abort = new AbortController();
        if (s.abortAfterMs !== undefined) setTimeout(() => abort.abort('the user stopped it'), s.abortAfterMs);
        // The host quits (closed, crashed) with the call open: no close(), no cancel, the process ends.
        if (s.quitAfterMs !== undefined) setTimeout(() => { out.quit = step; finish(0); }, s.quitAfterMs);
        record.result = await client.callTool({ name: s.name, arguments: s.arguments }, undefined, {
          signal: abort.signal,
          timeout: s.timeoutMs ?? 60000,
          onprogress: (p) => out.progress.push({ step, ...p }),
        });
      } else if (s.op === 'sleep') {
        // The host stays connected (a late form answer or a cancel notification still goes out).
        await new Promise((resolve) => setTimeout(resolve, s.ms));
      } else {
        throw new Error(`unknown op ${s.op}`);
      }
    } catch (err) {
      record.error = describeError(err);
    }
    record.ms = Date.now() - started;
    out.steps.push(record);
  }
  try {
    await client.close();
  } catch (err) {
    out.closeError = describeError(err);
  }
  finish(0);
}
