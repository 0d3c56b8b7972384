// E2B's base SDK (the `e2b` package), unmodified, against minipy-mcp -e2b: a sandbox of
// its default template, files in and out (several at once, bytes, a stream), listing,
// and commands, which minipy does not serve yet. Prints what it saw as one JSON object.
import { Sandbox } from 'e2b'

const out = {}
const sbx = await Sandbox.create()
out.template = (await sbx.getInfo()).templateId
out.running = await sbx.isRunning()
const written = await sbx.files.write([
  { path: '/home/user/in/a.txt', data: 'alpha' },
  { path: '/home/user/in/b.bin', data: new Uint8Array([0, 1, 2, 255]) },
])
out.written = written.map((w) => w.path).sort()
out.bytes = Array.from(await sbx.files.read('/home/user/in/b.bin', { format: 'bytes' }))
const stream = await sbx.files.read('/home/user/in/a.txt', { format: 'stream' })
let streamed = ''
for await (const chunk of stream) streamed += Buffer.from(chunk).toString()
out.streamed = streamed
out.listed = (await sbx.files.list('/home/user/in')).map((e) => e.name)
try {
  await sbx.commands.run('echo hi')
} catch (e) {
  out.commands = e.constructor.name
}
out.killed = await sbx.kill()
out.runningAfter = await sbx.isRunning()
console.log(JSON.stringify(out))
process.exit(0)
