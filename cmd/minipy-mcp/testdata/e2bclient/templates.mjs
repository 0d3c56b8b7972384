// E2B's base SDK (the `e2b` package), unmodified, builds templates on minipy-mcp -e2b
// (Template.build: its files uploaded, its steps run in a sandbox), starts sandboxes of one,
// and meets the refusals: another image, a failing step, root where the server has none.
// Prints what it saw as one
// JSON object. CONTEXT is a directory it may write (the template's files).
import fs from 'node:fs'
import path from 'node:path'
import { Sandbox, Template, waitForFile } from 'e2b'

const out = {}
const ctx = process.env.CONTEXT
fs.mkdirSync(path.join(ctx, 'folder', 'sub'), { recursive: true })
fs.writeFileSync(path.join(ctx, 'folder', 'test.txt'), 'This is a test file.')
fs.writeFileSync(path.join(ctx, 'folder', 'sub', 'deep.txt'), 'deep')
fs.symlinkSync('test.txt', path.join(ctx, 'folder', 'link.txt'))
fs.writeFileSync(path.join(ctx, 'run.sh'), '#!/bin/sh\necho ran\n')

const logs = []
const template = Template({ fileContextPath: ctx })
  .fromBaseImage()
  .copy('folder/*', 'folder', { forceUpload: true })
  .copy('run.sh', '/app/bin/', { mode: 0o755 })
  .runCmd('cat folder/test.txt > copied.txt && git --version > /dev/null')
  .setEnvs({ GREETING: 'hello template' })
  .setWorkdir('/app')
  .runCmd('echo "$GREETING" > greeting.txt && mkdir -p /tmp/cache && echo kept > /tmp/cache/x')
  .makeSymlink('greeting.txt', 'hello.txt')
  // (the file its ready check waits for made late, holding the sandbox's own boot id: a
  // sandbox of the template is ready once its own start command made it, not the build's)
  .setStartCmd('sleep 0.3 && cat /proc/sys/kernel/random/boot_id > /tmp/started && sleep 600',
    waitForFile('/tmp/started'))
const name = 'tpl-' + Date.now()
const info = await Template.build(template, name, { onBuildLogs: (e) => logs.push(e.message) })
out.built = { name: info.name, hasID: info.templateId.length > 0 }
out.logged = logs.some((l) => l.includes('RUN')) && logs.some((l) => l.includes('Template is ready'))
out.exists = [await Template.exists(name), await Template.exists(name + '-not')]

const sbx = await Sandbox.create(name)
const run = async (cmd) => (await sbx.commands.run(cmd)).stdout.trim()
out.inside = {
  pwd: await run('pwd'),
  copied: await sbx.files.read('/home/user/copied.txt'),
  folder: await run('ls /home/user/folder | tr "\\n" " "'),
  link: await run('readlink /home/user/folder/link.txt'),
  script: await run('/app/bin/run.sh'),
  greeting: await run('cat hello.txt'),
  env: await run('echo "$GREETING"'),
  tmp: await run('cat /tmp/cache/x'),
  started: (await run('cat /tmp/started')) === (await run('cat /proc/sys/kernel/random/boot_id')),
}
await sbx.kill()

// A build of the same name with a tag: the name moves to it, the first build keeps its tag.
await Template.build(Template().fromTemplate(name).runCmd('echo v2 > /app/version'), name + ':v2')
const version = async (ref) => {
  const s = await Sandbox.create(ref)
  const v = (await s.commands.run('cat /app/version 2>/dev/null || echo none')).stdout.trim()
  await s.kill()
  return v
}
out.tags = [await version(name), await version(name + ':v2'), await version(name + ':default')]

// Tags moved and removed (Template.assignTags, removeTags, getTags).
const listTags = async () => (await Template.getTags(info.templateId)).map((t) => t.tag).sort().join(' ')
out.tagsListed = await listTags()
const assigned = await Template.assignTags(name + ':v2', ['prod', 'stable'])
out.assigned = { tags: assigned.tags, hasBuild: typeof assigned.buildId === 'string' && assigned.buildId.length > 0 }
out.prodIsV2 = await version(name + ':prod')
await Template.assignTags(name + ':default', 'prod') // (prod moves to the first build)
out.prodMoved = await version(name + ':prod')
await Template.removeTags(name, ['stable'])
out.stableGone = await Template.exists(name + ':stable')
out.removeMissing = await Template.removeTags(name, ['nope']).then(() => 'removed', (e) => e.constructor.name)
out.assignMissing = await Template.assignTags(name + ':nope', 'x').then(() => 'assigned', (e) => e.constructor.name)
out.tagsAfter = await listTags()
// (prod, moved off the newest build, comes off the first and does not fall back to the newest)
await Template.removeTags(name, 'prod')
out.prodGone = [await Template.exists(name + ':prod'), await listTags()]
// A tag a newer build took from an older one, removed, does not fall back to the older.
const name2 = name + '-b'
await Template.build(Template().fromBaseImage().runCmd('true'), name2, { tags: ['a', 'b'] })
await Template.build(Template().fromBaseImage().runCmd('true'), name2, { tags: ['b'] })
await Template.removeTags(name2, 'b')
out.takenGone = [await Template.exists(name2 + ':b'), await Template.exists(name2 + ':a')]
await Sandbox.deleteSnapshot(name2)

const failure = async (t) => {
  try {
    await Template.build(t, 'tpl-fail-' + Date.now())
    return 'built'
  } catch (e) {
    return e.constructor.name + ': ' + e.message
  }
}
out.failedStep = await failure(Template().fromBaseImage().runCmd('echo before && exit 3'))
out.otherImage = await failure(Template().fromImage('ubuntu:22.04').runCmd('ls'))
out.asRoot = await failure(Template().fromBaseImage().runCmd('test "$(whoami)" = root', { user: 'root' })
  .setUser('root').runCmd('test "$(id -u)" = 0 && mkdir -p /opt/tool && echo t > /opt/tool/x')
  .setUser('user').runCmd('test "$(whoami)" = user && test "$(stat -c %U /opt/tool/x)" = root'))
out.noUser = await failure(Template().fromBaseImage().runCmd('whoami', { user: 'root123' }))
out.fromMine = await failure(Template().fromTemplate(name).runCmd('test "$(cat /app/greeting.txt)" = "hello template"'))

const bg = await Template.buildInBackground(Template().fromBaseImage().runCmd('sleep 2'), 'tpl-bg-' + Date.now())
out.background = (await Template.getBuildStatus(bg)).status

await Sandbox.deleteSnapshot(info.templateId)
out.existsAfterDelete = [await Template.exists(name), await Template.exists(name + ':default'),
  await Template.exists(name + ':v2')]
console.log(JSON.stringify(out))
