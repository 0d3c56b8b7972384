// Sleeping and autoResume through the unmodified SDK, against minipy-mcp -e2b-sleep-idle: a
// sandbox left idle sleeps (the script waits until the server's metrics say so), is listed
// and described as running without waking, and its next runCode wakes it with its
// variables; a sandbox its timeout paused (lifecycle autoResume) wakes at its next runCode.
// Prints what it saw as one JSON object.
import { Sandbox } from '@e2b/code-interpreter'

const base = process.env.E2B_API_URL
async function metric(name) {
  const text = await (await fetch(base + '/metrics')).text()
  const m = text.match(new RegExp('^' + name + ' (\\d+)', 'm'))
  return m ? Number(m[1]) : -1
}
async function until(what) {
  while (!(await what())) {
    await new Promise((r) => setTimeout(r, 20))
  }
}

const out = {}
const sbx = await Sandbox.create({ timeoutMs: 600_000 })
await sbx.runCode('x = 41')
await until(async () => (await metric('minipy_e2b_sandboxes_asleep')) === 1)
out.listed = (await Sandbox.list().nextItems()).map((s) => s.state)
out.info = (await sbx.getInfo()).state
out.wokenBefore = await metric('minipy_e2b_sandboxes_woken_total')
out.x = (await sbx.runCode('x + 1')).text
out.wokenAfter = await metric('minipy_e2b_sandboxes_woken_total')
out.running = await sbx.isRunning()
await sbx.kill()

const auto = await Sandbox.create({ timeoutMs: 1_000, lifecycle: { onTimeout: 'pause', autoResume: true } })
await auto.runCode('y = 7')
await until(async () => (await auto.getInfo()).state === 'paused')
out.lifecycle = (await auto.getInfo()).lifecycle
const wokenBefore = await metric('minipy_e2b_sandboxes_woken_total')
out.y = (await auto.runCode('y + 1')).text
out.wokenByTraffic = (await metric('minipy_e2b_sandboxes_woken_total')) - wokenBefore
await auto.kill()
console.log(JSON.stringify(out))
