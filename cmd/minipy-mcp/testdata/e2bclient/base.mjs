// E2B's base SDK (the `e2b` package), unmodified, against minipy-mcp -e2b: a sandbox of
// its default template, files in and out (several at once, bytes, a stream), listing,
// and commands. Prints what it saw as one JSON object.
import { Sandbox } from 'e2b'

const out = {}
const sbx = await Sandbox.create()
out.template = (await sbx.getInfo()).templateId
out.running = await sbx.isRunning()
const written = await sbx.files.write([
  { path: '/home/user/in/a.txt', data: 'alpha' },
  { path: '/home/user/in/b.bin', data: new Uint8Array([0, 1, 2, 255]) },
])
await sbx.files.write('/home/user/in/zipped.txt', 'compressed on the wire', { gzip: true })
out.gzipped = await sbx.files.read('/home/user/in/zipped.txt')
out.bytes = Array.from(await sbx.files.read('/home/user/in/b.bin', { format: 'bytes' }))
const stream = await sbx.files.read('/home/user/in/a.txt', { format: 'stream' })
let streamed = ''
for await (const chunk of stream) streamed += Buffer.from(chunk).toString()
out.streamed = streamed
out.listed = (await sbx.files.list('/home/user/in')).map((e) => e.name).filter((n) => n !== 'zipped.txt')
// Commands: output, streaming, exit codes, environment, working directory, stdin, the
// files the code sees, background commands listed and killed.
const ran = await sbx.commands.run('echo "hi $WHO from $(pwd)"; echo warn >&2; cat in/a.txt', { envs: { WHO: 'me' } })
out.run = { stdout: ran.stdout, stderr: ran.stderr, exitCode: ran.exitCode }
const chunks = []
await sbx.commands.run('for i in 1 2 3; do echo tick $i; done', { onStdout: (d) => chunks.push(d) })
out.ticks = chunks.join('')
try {
  await sbx.commands.run('echo partial; exit 7')
} catch (e) {
  out.failed = { kind: e.constructor.name, exitCode: e.exitCode, stdout: e.stdout }
}
out.cwd = (await sbx.commands.run('pwd', { cwd: '/home/user/in' })).stdout
const bg = await sbx.commands.run('cat', { background: true, stdin: true })
await sbx.commands.sendStdin(bg.pid, 'echoed back\n')
await sbx.commands.closeStdin(bg.pid)
out.stdin = (await bg.wait()).stdout
const sleeper = await sbx.commands.run('sleep 60', { background: true })
out.listedCommands = (await sbx.commands.list()).map((p) => p.pid).includes(sleeper.pid)
out.killedCommand = await sbx.commands.kill(sleeper.pid)
out.listedAfterKill = (await sbx.commands.list()).map((p) => p.pid).includes(sleeper.pid) // (gone once kill answers)
try {
  await sleeper.wait()
} catch (e) {
  out.sleeperEnd = e.constructor.name
}
// A terminal (sandbox.pty): typed into, resized, its output streamed.
let shown = ''
const term = await sbx.pty.create({ cols: 80, rows: 24, envs: { ABC: '123' }, onData: (d) => { shown += Buffer.from(d).toString() } })
await sbx.pty.resize(term.pid, { cols: 100, rows: 24 })
await sbx.pty.sendInput(term.pid, new TextEncoder().encode('echo $ABC; tput cols\nexit\n'))
const ended = await term.wait()
out.pty = { exitCode: ended.exitCode, abc: shown.includes('123'), cols: shown.includes('100') }
// A pause without its memory resumes as a new boot: the files, not the variables.
const boot = async () => (await sbx.commands.run('cat /proc/sys/kernel/random/boot_id')).stdout.trim()
await sbx.files.write('/home/user/kept.txt', 'on disk')
const bootBefore = await boot()
await sbx.pause({ keepMemory: false })
await sbx.connect()
out.coldBoot = { newBoot: (await boot()) !== bootBefore, file: await sbx.files.read('/home/user/kept.txt') }
out.written = written.map((w) => w.path).sort()
out.killed = await sbx.kill()
out.runningAfter = await sbx.isRunning()
console.log(JSON.stringify(out))
process.exit(0)
