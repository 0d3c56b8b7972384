// Sandboxes outlive minipy-mcp with -state-dir. PHASE=before: one sandbox paused (with a
// variable, a function and a file), one left running; the server then restarts (SIGTERM
// pauses the running one into the directory). PHASE=after (IDS=paused,running): both are
// listed paused, and connect resumes each with its state. Prints what it saw as one JSON
// object.
import { Sandbox } from '@e2b/code-interpreter'

const out = {}
if (process.env.PHASE === 'before') {
  const paused = await Sandbox.create({ metadata: { which: 'paused' } })
  await paused.runCode('x = 40\ndef twice(n):\n    return 2 * n')
  await paused.files.write('/home/user/note.txt', 'kept')
  out.paused = await paused.pause()
  const running = await Sandbox.create({ metadata: { which: 'running' } })
  await running.runCode('y = 2')
  out.ids = [paused.sandboxId, running.sandboxId]
} else {
  const [p, r] = process.env.IDS.split(',')
  const listed = await Sandbox.list().nextItems()
  out.listed = Object.fromEntries(listed.map((s) => [s.metadata.which, s.state]))
  const a = await Sandbox.connect(p)
  out.x = (await a.runCode('twice(x) + 2')).text
  out.note = await a.files.read('/home/user/note.txt')
  const b = await Sandbox.connect(r)
  out.y = (await b.runCode('y * 21')).text
  out.running = (await Sandbox.list({ query: { state: ['running'] } }).nextItems()).length
}
console.log(JSON.stringify(out))
