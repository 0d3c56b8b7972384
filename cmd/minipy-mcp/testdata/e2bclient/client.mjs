// E2B's code interpreter SDK, unmodified, against minipy-mcp -e2b (E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY point it there): the README's examples and more. Prints
// what it saw as one JSON object for e2b_test.go to check.
import { Sandbox } from '@e2b/code-interpreter'

const out = {}
const sbx = await Sandbox.create({ metadata: { purpose: 'e2b-test' }, envs: { GREETING: 'hi' } })
out.id = sbx.sandboxId

// State across runs, and the value as the main result.
await sbx.runCode('x = 1')
out.state = (await sbx.runCode('x += 1; x')).text

// Streaming callbacks, and the logs.
const streamed = []
const printed = await sbx.runCode('import sys\nfor i in range(3):\n    print("tick", i, flush=True)\nprint("warn", file=sys.stderr)', {
  onStdout: (m) => streamed.push('out:' + m.line),
  onStderr: (m) => streamed.push('err:' + m.line),
})
out.stdout = printed.logs.stdout.join('')
out.stderr = printed.logs.stderr.join('')
out.streamed = streamed.join('')

// An error: name, value, traceback.
const failed = await sbx.runCode('def f():\n    return 1/0\nf()')
out.error = { name: failed.error?.name, value: failed.error?.value, traceback: failed.error?.traceback }

// A matplotlib figure: a PNG result.
const plot = await sbx.runCode('import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()')
out.plot = plot.results.map((r) => ({
  formats: r.formats(),
  main: r.isMainResult,
  head: r.png ? Buffer.from(r.png, 'base64').subarray(0, 4).toString('hex') : '',
}))
out.html = (await sbx.runCode('from IPython.display import HTML\nHTML("<b>bold</b>")')).results.map((r) => r.html)

// Environment variables: the sandbox's, and one run's own.
out.env = (await sbx.runCode('import os\nos.environ["GREETING"]')).text
out.runEnv = (await sbx.runCode('os.environ.get("ONCE")', { envs: { ONCE: 'yes' } })).text
out.runEnvAfter = (await sbx.runCode('os.environ.get("ONCE", "gone")')).text

// Files both ways.
await sbx.files.write('/home/user/data.csv', 'a,b\n1,2\n')
out.readByCode = (await sbx.runCode('open("/home/user/data.csv").read()')).text
out.cwd = (await sbx.runCode('import os\nos.getcwd()')).text
await sbx.runCode('with open("out.txt", "w") as f:\n    f.write("from python")')
out.download = await sbx.files.read('/home/user/out.txt')
try {
  await sbx.files.read('/home/user/missing.txt')
} catch (e) {
  out.missingFile = e.constructor.name
}

// The filesystem service: list, makeDir, rename, exists, getInfo, remove.
out.madeDir = await sbx.files.makeDir('/home/user/reports/2026')
out.madeAgain = await sbx.files.makeDir('reports/2026')
await sbx.files.write('/home/user/reports/2026/q4.txt', 'quarter')
await sbx.files.rename('/home/user/reports/2026/q4.txt', '/home/user/reports/final.txt')
out.listed = (await sbx.files.list('/home/user/reports')).map((e) => `${e.type}:${e.path}`)
out.deep = (await sbx.files.list('/home/user', { depth: 3 })).filter((e) => e.path.startsWith('/home/user/reports')).length
const info = await sbx.files.getInfo('reports/final.txt')
out.fileInfo = { name: info.name, type: info.type, size: info.size }
out.exists = [await sbx.files.exists('/home/user/reports/final.txt'), await sbx.files.exists('/home/user/nope')]
out.byCode = (await sbx.runCode('open("reports/final.txt").read()')).text
await sbx.files.remove('/home/user/reports')
out.existsAfterRemove = await sbx.files.exists('/home/user/reports')
try {
  await sbx.files.list('/etc')
} catch (e) {
  out.outside = e.constructor.name
}

// Contexts: each its own variables.
const ctx = await sbx.createCodeContext()
await sbx.runCode('y = 5', { context: ctx })
out.ctxOwn = (await sbx.runCode('y', { context: ctx })).text
out.ctxApart = (await sbx.runCode('"y" in dir()')).text
out.contexts = (await sbx.listCodeContexts()).length
await sbx.restartCodeContext(ctx)
out.ctxRestarted = (await sbx.runCode('"y" in dir()', { context: ctx })).text
await sbx.removeCodeContext(ctx)
out.contextsAfter = (await sbx.listCodeContexts()).length

// Two sandboxes apart; listing by metadata; info; connecting from elsewhere.
const other = await Sandbox.create()
out.apart = (await other.runCode('"x" in dir()')).text
out.sandboxes = (await Sandbox.list({ query: { metadata: { purpose: 'e2b-test' } } }).nextItems()).map((s) => s.sandboxId)
const sbxInfo = await sbx.getInfo()
out.info = { state: sbxInfo.state, metadata: sbxInfo.metadata, template: sbxInfo.templateId }
const again = await Sandbox.connect(sbx.sandboxId)
out.connected = (await again.runCode('x')).text
await sbx.setTimeout(60_000)

// Kill: gone for good.
out.killed = await other.kill()
out.runningAfterKill = await other.isRunning()
try {
  await other.runCode('1')
} catch (e) {
  out.afterKill = e.constructor.name
}

// Pause and resume (connect): the variables, functions and files come back, those written
// outside the working directory too.
const p = await Sandbox.create()
await p.runCode('def greet(n):\n    return "hi " + n\nkept = [1, 2, 3]\nwith open("note.txt", "w") as f:\n    f.write("saved")')
await p.commands.run('mkdir -p /tmp/repo /app && echo tmp > /tmp/repo/x && echo app > /app/y')
out.paused = await p.pause()
out.pausedAgain = await p.pause()
out.pausedState = (await Sandbox.getInfo(p.sandboxId)).state
try {
  await p.runCode('1')
} catch (e) {
  out.whilePaused = e.constructor.name
}
const resumed = await Sandbox.connect(p.sandboxId)
out.resumed = (await resumed.runCode('greet("you") + " " + str(sum(kept)) + " " + open("note.txt").read()')).text
out.resumedState = (await resumed.getInfo()).state
out.resumedElsewhere = [await resumed.files.read('/tmp/repo/x'), (await resumed.commands.run('cat /app/y')).stdout]
await resumed.kill()

// A wrong API key.
try {
  await Sandbox.create({ apiKey: 'not-a-token-of-the-server' })
} catch (e) {
  out.wrongKey = e.constructor.name
}
await sbx.kill()
console.log(JSON.stringify(out))
// (a failed runCode leaves its request timer, 60 s, keeping node up)
process.exit(0)
