// A real MCP client from another SDK (the official TypeScript one) for the Go tests: it
// connects to the Streamable HTTP endpoint given as its argument, lists the tools, runs
// code in one session (with a progress token) and prints what it saw as one JSON document.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const client = new Client({ name: "minipy-ts-test", version: "0" });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
const text = (r) => r.content.map((c) => c.text).join("");
const tools = (await client.listTools()).tools.map((t) => t.name).sort();
const progress = [];
const first = await client.callTool(
  { name: "minipy", arguments: { code: "import time\nx = 6\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.6)" } },
  undefined,
  { onprogress: (p) => progress.push(p), timeout: 60000 },
);
const second = await client.callTool({ name: "minipy", arguments: { code: "x * 7" } });
const error = await client.callTool({ name: "minipy", arguments: { code: "1/0" } });
const plot = await client.callTool({
  name: "minipy",
  arguments: { code: "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()" },
});
console.log(JSON.stringify({
  tools,
  first: text(first),
  progress: progress.map((p) => p.message),
  second: text(second),
  error: { isError: error.isError, text: text(error) },
  // Each content item's type and mimeType, and the first bytes (hex) of an image's decoded data.
  plot: plot.content.map((c) => ({
    type: c.type,
    mimeType: c.mimeType,
    text: c.text,
    head: c.data === undefined ? undefined : Buffer.from(c.data, "base64").subarray(0, 4).toString("hex"),
  })),
}));
await client.close();
