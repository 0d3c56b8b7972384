// Two users of one minipy-mcp server (serve_test.go), as the official TypeScript SDK's
// clients: user A leaves files, a variable and a process behind; user B looks for them,
// through the code and as MCP resources; then B tries A's session with its own token, and
// clients come without a token and with a wrong one. Arguments: the MCP endpoint, A's token, B's token. Prints one JSON document.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, tokenA, tokenB] = process.argv.slice(2);
const options = (token, extra = {}) => ({
  requestInit: token ? { headers: { Authorization: `Bearer ${token}` } } : {},
  ...extra,
});
const text = (r) => r.content.map((c) => c.text).join("");

async function connect(token, extra) {
  const transport = new StreamableHTTPClientTransport(new URL(url), options(token, extra));
  const client = new Client({ name: "minipy-tenant-test", version: "0" });
  await client.connect(transport);
  return { client, transport };
}

async function run(client, code) {
  return text(await client.callTool({ name: "minipy", arguments: { code } }));
}

// How a refused client fails: the HTTP status the SDK reports, and its message.
async function refusal(fn) {
  try {
    await fn();
    return { code: 0, message: "" };
  } catch (e) {
    return { code: e.code ?? -1, message: String(e.message) };
  }
}

const a = await connect(tokenA);
const b = await connect(tokenB);
const wroteResult = await a.client.callTool({ name: "minipy", arguments: { code: `import os, subprocess
secret = "tenant-a-7731"
os.makedirs("sub/deeper", exist_ok=True)
for path in ("tenant_a.txt", "sub/tenant_a.txt", "sub/deeper/tenant_a.txt", "/tmp/tenant_a.txt", "/dev/shm/tenant_a.txt"):
    open(path, "w").write(secret)
open("blob.bin", "wb").write(bytes(range(256)))
sleeper = subprocess.Popen(["sleep", "120"])
print(os.getcwd())` } });
const wrote = text(wroteResult);
// A's files as MCP resources: the links after the text, the list, a text and a blob read.
const links = wroteResult.content.filter((c) => c.type === "resource_link")
  .map((c) => `${c.uri} ${c.name} ${c.mimeType ?? ""} ${c.size}`);
const listA = (await a.client.listResources()).resources.map((r) => r.name);
const readText = (await a.client.readResource({ uri: "minipy://files/sub/deeper/tenant_a.txt" })).contents[0].text;
const blob = (await a.client.readResource({ uri: "minipy://files/blob.bin" })).contents[0];
const readBlob = `${blob.mimeType} ${Buffer.from(blob.blob, "base64").length}`;
const listB = (await b.client.listResources()).resources.map((r) => r.name);
const readByB = await refusal(() => b.client.readResource({ uri: "minipy://files/tenant_a.txt" }));

const probe = await run(b.client, `import glob, json, os
hits = []
for pattern in ("**", "/work/**", "/namespaces/**", "/tmp/**", "/dev/shm/**"):
    for path in glob.glob(pattern, recursive=True):
        try:
            if os.path.isfile(path) and "tenant-a-7731" in open(path, errors="replace").read():
                hits.append(path)
        except OSError:
            pass
commands = []
for pid in (p for p in os.listdir("/proc") if p.isdigit()):
    try:
        commands.append(open("/proc/%s/cmdline" % pid, "rb").read().replace(b"\\0", b" ").decode())
    except OSError:
        pass
print(json.dumps({"hits": hits, "secret": "secret" in globals(), "sleeper": any("sleep 120" in c for c in commands),
                  "processes": len(commands), "cwd": os.getcwd(), "listing": sorted(os.listdir("."))}))`);
const stillA = await run(a.client, `print(secret, open("sub/deeper/tenant_a.txt").read(), open("/tmp/tenant_a.txt").read())`);

// B's token on A's session: refused, never served.
const hijack = await refusal(async () => {
  const t = await connect(tokenB, { sessionId: a.transport.sessionId });
  await run(t.client, "secret");
});
const noToken = await refusal(() => connect(""));
const wrongToken = await refusal(() => connect("not-a-token-of-this-server"));
const afterHijack = await run(a.client, "print(secret)");

for (const c of [a, b]) {
  await c.transport.terminateSession();
  await c.client.close();
}
console.log(JSON.stringify({ wrote, links, listA, readText, readBlob, listB, readByB, probe, stillA, hijack, noToken,
  wrongToken, afterHijack }));
