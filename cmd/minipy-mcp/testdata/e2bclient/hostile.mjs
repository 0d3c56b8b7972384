// What a hostile command tries, through E2B's SDK against minipy-mcp -e2b: killing the
// sandbox's pid 1, reading its memory, more commands than a sandbox may run, another
// sandbox's commands. Prints what it saw as one JSON object.
import { Sandbox } from '@e2b/code-interpreter'

const out = {}
const sbx = await Sandbox.create()
const other = await Sandbox.create()
await sbx.runCode('x = 42')
const tries = await sbx.commands.run(
  'kill -9 1; sleep 0.2; kill -0 1 && echo "pid 1 alive"; ' +
    'head -c 1 /proc/1/mem >/dev/null 2>&1 || echo "mem refused"; ls /proc/1/fd >/dev/null 2>&1 || echo "fds refused"',
  { timeoutMs: 10000 })
out.tries = tries.stdout
out.stillThere = (await sbx.runCode('x')).text
const sleepers = []
for (let i = 0; i < 16; i++) sleepers.push(await sbx.commands.run('sleep 60', { background: true }))
try {
  await sbx.commands.run('sleep 60', { background: true })
} catch (e) {
  out.seventeenth = e.constructor.name
}
for (const s of sleepers) await sbx.commands.kill(s.pid)
out.afterKills = (await sbx.commands.run('echo room again')).stdout
// The other sandbox's SDK object cannot reach this one's commands with its own token.
const forged = await Sandbox.connect(sbx.sandboxId)
forged.envdAccessToken = other.envdAccessToken
try {
  await forged.commands.list()
} catch (e) {
  out.forged = e.constructor.name
}
await sbx.kill()
await other.kill()
console.log(JSON.stringify(out))
process.exit(0)
