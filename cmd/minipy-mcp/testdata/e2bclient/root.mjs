// E2B's base SDK (the `e2b` package), unmodified, uses a sandbox's root user on minipy-mcp
// -e2b (a root host's: IsolatedConfig.RootUser): commands as root, sudo, files as root
// (root's home for relative paths, signed URLs), root's files kept through a pause, and a
// user the sandbox has not. Prints what it saw as one JSON object.
import { Sandbox } from 'e2b'

const out = {}
const sbx = await Sandbox.create('base')
const run = async (cmd, opts) => (await sbx.commands.run(cmd, opts)).stdout.trim()
out.commands = {
  whoami: await run('whoami'),
  root: await run('whoami; echo "$HOME"; pwd', { user: 'root' }),
  sudo: await run('sudo whoami; sudo sh -c \'echo "[$FOO]"\'', { envs: { FOO: 'scoped' } }),
  sudoUser: await run('sudo -u user id -u', { user: 'root' }),
}
const written = await sbx.files.write('hello.txt', 'hello root', { user: 'root' })
out.written = written.path
out.readAsRoot = await sbx.files.read('hello.txt', { user: 'root' })
out.readAsUser = await sbx.files.read('/root/hello.txt').then(() => 'read', (e) => e.constructor.name)
out.owner = (await sbx.files.getInfo('/root/hello.txt', { user: 'root' })).owner
out.listed = (await sbx.files.list('/root', { user: 'root' })).map((e) => e.name + ':' + e.owner)
out.stat = await run('stat -c "%U %a" /root/hello.txt /root', { user: 'root' })
const url = await sbx.downloadUrl('hello.txt', { user: 'root', useSignatureExpiration: 10_000 })
out.signed = await (await fetch(url)).text()
const up = await sbx.uploadUrl('up.txt', { user: 'root', useSignatureExpiration: 10_000 })
const form = new FormData()
form.append('file', 'uploaded')
out.uploaded = await (await fetch(up, { method: 'POST', body: form })).json()
// A watch of root's home, as root (as the user it may not read it).
const seen = []
const watch = await sbx.files.watchDir('/root', (ev) => seen.push(ev.name), { user: 'root' })
await sbx.files.write('/root/watched.txt', 'w', { user: 'root' })
for (let i = 0; i < 500 && !seen.includes('watched.txt'); i++) await new Promise((r) => setTimeout(r, 20))
await watch.stop()
out.watched = seen.includes('watched.txt')
out.watchAsUser = await sbx.files.watchDir('/root', () => {}).then((w) => w.stop().then(() => 'watched'),
  (e) => e.constructor.name)
out.badUser = await sbx.files.write('x.txt', 'x', { user: 'admin' }).then(() => 'written', (e) => e.message)
out.badCommandUser = await sbx.commands.run('true', { user: 'admin' }).then(() => 'ran', (e) => e.message)

await sbx.commands.run('sudo sh -c "echo secret > /root/key && chmod 600 /root/key && mkdir -p /srv && echo s > /srv/s"')
await sbx.pause()
const again = await Sandbox.connect(sbx.sandboxId)
out.afterPause = (await again.commands.run('stat -c "%U %a %n" /root/key /srv/s; cat /root/key', { user: 'root' }))
  .stdout.trim()
await again.kill()

// An MCP gateway: the SDK starts it as root, as a command; the sandbox has none, and the
// SDK kills the sandbox it made (E2B's 'MCP gateway start failure kills the created sandbox').
const metadata = { mcpCheck: String(Date.now()) }
out.mcp = await Sandbox.create('base', { metadata, mcp: { invalid_server: {} } }).then(() => 'created', (e) => e.message)
out.mcpLeft = (await Sandbox.list({ query: { metadata } }).nextItems()).length
console.log(JSON.stringify(out))
