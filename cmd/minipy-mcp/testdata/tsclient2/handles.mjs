// A client of MCP 2026-07-28 from another SDK (the official TypeScript SDK v2, with version
// negotiation on) for the Go tests: it connects to the endpoint given as its argument, runs
// code without a session handle, then with the handle the server returned, and prints what
// it saw as one JSON document (see handles_test.go).
import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

const client = new Client({ name: "minipy-ts2-test", version: "0" }, { versionNegotiation: { mode: "auto" } });
const headers = [];
const fetchSpy = async (url, init) => {
  const h = new Headers(init?.headers);
  headers.push({ version: h.get("mcp-protocol-version"), session: h.get("mcp-param-session") });
  return fetch(url, init);
};
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2]), { fetch: fetchSpy }));
const text = (r) => r.content.map((c) => c.text).join("");
const tools = (await client.listTools()).tools;
const first = await client.callTool({ name: "minipy", arguments: { code: "x = 6" } });
const handle = first.structuredContent?.session;
const second = await client.callTool({ name: "minipy", arguments: { code: "x * 7", session: handle } });
const fresh = await client.callTool({ name: "minipy", arguments: { code: "'x' in dir()" } });
const unknown = await client.callTool({ name: "minipy", arguments: { code: "1", session: "mpy_nothing" } });
console.log(JSON.stringify({
  version: client.getNegotiatedProtocolVersion(),
  header: tools.find((t) => t.name === "minipy").inputSchema.properties.session["x-mcp-header"],
  first: text(first),
  handle,
  second: text(second),
  fresh: text(fresh),
  unknown: { isError: unknown.isError, text: text(unknown) },
  mirrored: headers.some((h) => h.session === handle),
  versions: [...new Set(headers.map((h) => h.version).filter(Boolean))],
}));
await client.close();
